"""Replacements that dynamo must trace through (kept off the skip list in ``hooks.py``).

FlexAttention checks its inputs' device against a fixed list (cuda, cpu, xpu, hpu, mps) and
refuses any other, and decides from the device type whether its kernel returns the
log-sum-exp (CPU: never, its inference-only kernel has none). Its compiled form only needs inductor to generate code for the
graph's device — which, for ``neuron``, is the host executor's (``backend.py``). On ``neuron``
the checks apply the host executor's rules instead (the CPU executor, like CPU, has no
FlexAttention backward and no log-sum-exp output); every other device keeps PyTorch's.
"""
from __future__ import annotations

from torch.nn.attention import flex_attention as _fa

_orig_validate_device = _fa._validate_device
_orig_apply_kernel_options = _fa._apply_kernel_options
HOST_TYPE = ["cpu"]    # set by hooks.install() from the host executor


def validate_device(query, key, value) -> None:
    if query.device.type == "neuron":
        if HOST_TYPE[0] == "cpu" and (query.requires_grad or key.requires_grad
                                      or value.requires_grad):
            raise NotImplementedError(
                "FlexAttention does not support backward on neuron with the CPU host executor "
                "(its compiled kernels are inductor's CPU ones, which have no backward, as on "
                "CPU). Set requires_grad=False on query/key/value, or use "
                "scaled_dot_product_attention for training.")
        return
    _orig_validate_device(query, key, value)


def apply_kernel_options(query, key, value, return_lse, kernel_options, return_aux=None):
    opts = _orig_apply_kernel_options(query, key, value, return_lse, kernel_options, return_aux)
    wants_lse = return_lse or (return_aux is not None and return_aux.lse)
    if query.device.type == "neuron" and HOST_TYPE[0] == "cpu" and not wants_lse:
        opts["OUTPUT_LOGSUMEXP"] = False
    return opts
