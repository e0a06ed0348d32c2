"""Replacements that dynamo must trace through (kept off the skip list in ``registration.py``).

FlexAttention checks its inputs' device against a fixed list (cuda, cpu, xpu, hpu, mps) and
refuses any other, and decides from the device type whether its kernel returns the
log-sum-exp (CPU: never, its inference-only kernel has none). On ``neuron`` both kernels are
the device's own (``flex_attention.py``: block-sparse forward with the log-sum-exp, and a
backward), whatever the host executor: the device check passes, and PyTorch's kernel options
apply unchanged (``neuron`` is not ``cpu``: the log-sum-exp is written when grad mode is on).
Every other device keeps PyTorch's checks.
"""
from __future__ import annotations

from torch.nn.attention import flex_attention as _fa

_orig_validate_device = _fa._validate_device


def validate_device(query, key, value) -> None:
    if query.device.type == "neuron":
        return
    _orig_validate_device(query, key, value)

