"""Replacements that dynamo must trace through (kept off the skip list in ``hooks.py``).

FlexAttention checks its inputs' device against a fixed list (cuda, cpu, xpu, hpu, mps) and
refuses any other, and decides from the device type whether its kernel returns the
log-sum-exp (CPU: never, its inference-only kernel has none). On ``neuron`` both kernels are
the device's own (``flex_attention.py``: block-sparse forward with the log-sum-exp, and a
backward), whatever the host executor: the device check passes and the log-sum-exp follows
PyTorch's rule for devices with a backward (written when grad mode is on). Every other device
keeps PyTorch's checks.
"""
from __future__ import annotations

from torch.nn.attention import flex_attention as _fa

_orig_validate_device = _fa._validate_device
_orig_apply_kernel_options = _fa._apply_kernel_options
HOST_TYPE = ["cpu"]    # set by hooks.install() from the host executor


def validate_device(query, key, value) -> None:
    if query.device.type == "neuron":
        return
    _orig_validate_device(query, key, value)


def apply_kernel_options(query, key, value, return_lse, kernel_options, return_aux=None):
    return _orig_apply_kernel_options(query, key, value, return_lse, kernel_options, return_aux)
