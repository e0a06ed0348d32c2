"""``torch.autocast('neuron', dtype=torch.bfloat16)``.

PyTorch ships autocast kernels for CUDA/CPU/XPU/MPS/... but none for the PrivateUse1 autocast key,
so every op would fail with "Could not run ... 'Autocastneuron' backend". We register a
fallthrough for all ops and, for the ops CUDA autocast runs in lower precision (matmuls and
convolutions), a kernel that casts floating inputs to the autocast dtype and redispatches below
the autocast key — the same policy as CUDA's ``lower_precision_fp`` list. Ops CUDA runs in
float32 (softmax, losses, norms) keep their input dtype here.
"""
from __future__ import annotations

import torch

LOWER_PRECISION = (
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d.input",
    "conv_transpose3d.input", "convolution", "_convolution", "addmm", "addmv", "addr", "matmul",
    "einsum", "mm", "mv", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "prelu", "_scaled_dot_product_attention_math", "scaled_dot_product_attention",
)
_KEY = "AutocastPrivateUse1"
_libs: list = []


def _cast(x, dtype):
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64:
        return x.to(dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(v, dtype) for v in x)
    return x


def _make(op):
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype("neuron")
        with torch._C._ExcludeDispatchKeyGuard(exclude):
            return op(*_cast(args, dtype), **{k: _cast(v, dtype) for k, v in kwargs.items()})

    return kernel


def register() -> None:
    lib = torch.library.Library("aten", "IMPL")
    fb = torch.library.Library("_", "IMPL")
    fb.fallback(torch.library.fallthrough_kernel, dispatch_key=_KEY)
    for name in LOWER_PRECISION:
        base, _, overload = name.partition(".")
        packet = getattr(torch.ops.aten, base, None)
        if packet is None:
            continue
        for ov in ([overload] if overload else packet.overloads()):
            op = getattr(packet, ov)
            lib.impl(f"{base}.{ov}" if ov != "default" else base, _make(op), _KEY)
    _libs.extend([lib, fb])
