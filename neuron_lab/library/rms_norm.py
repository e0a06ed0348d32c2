"""A fused RMSNorm as two device kernels with autograd: what a researcher writes in NKI.

``torch.nn.RMSNorm`` on the device is ~6 ops forward (pow, mean, add, rsqrt, mul, mul) and more
backward; here the forward is one kernel returning ``y`` and the per-row ``rstd`` it saves for
backward, and the backward one kernel returning ``dx`` and ``dw``. The math, for rows x of width
n, x̂ = x·rstd, rstd = (mean(x²) + eps)^-½:

    y  = x̂ · w
    dx = rstd · (g·w − x̂ · mean(g·w·x̂))
    dw = Σ_rows g · x̂

Statistics are computed in float32 (or the input's dtype if wider) (as PyTorch's CPU and CUDA kernels
do), so bf16 training keeps its accuracy. Results match ``torch.nn.RMSNorm`` to float32
rounding (``tests/device/test_custom_kernels.py`` states the tolerance).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..device.custom_kernels import kernel


def _acc(dtype: torch.dtype) -> torch.dtype:
    """The dtype statistics are computed in: float32, or the input's if wider."""
    return torch.promote_types(dtype, torch.float32)


@kernel("neuron_lab::rms_norm_fwd", mutates_args=())
def rms_norm_fwd(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    xf = x.to(_acc(x.dtype))
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * rstd * weight.to(xf.dtype)).to(x.dtype), rstd


@rms_norm_fwd.register_fake
def _(x, weight, eps):
    return torch.empty_like(x), x.new_empty((*x.shape[:-1], 1), dtype=_acc(x.dtype))


@kernel("neuron_lab::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(grad: Tensor, x: Tensor, weight: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    acc = rstd.dtype
    xhat = x.to(acc) * rstd
    gw = grad.to(acc) * weight.to(acc)
    dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
    dw = (grad.to(acc) * xhat).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)


@rms_norm_bwd.register_fake
def _(grad, x, weight, rstd):
    return torch.empty_like(x), torch.empty_like(weight)


def _setup(ctx, inputs, output):
    x, weight, _eps = inputs
    ctx.save_for_backward(x, weight, output[1])


def _backward(ctx, grad_y, _grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_bwd(grad_y.contiguous(), x, weight, rstd)
    return dx, dw, None


rms_norm_fwd.register_autograd(_backward, setup_context=_setup)


def rms_norm(x: Tensor, weight: Tensor, eps: float | None = None) -> Tensor:
    """RMSNorm over the last dimension (``torch.nn.functional.rms_norm(x, (n,), weight, eps)``)."""
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"neuron_lab.library.rms_norm: weight of shape {tuple(weight.shape)} does "
                         f"not match the last dimension of x {tuple(x.shape)}")
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    return rms_norm_fwd(x.contiguous(), weight, eps)[0]


class FusedRMSNorm(nn.Module):
    """``torch.nn.RMSNorm(n, eps)`` over the last dimension, as one forward and one backward
    kernel; its ``state_dict`` is ``nn.RMSNorm``'s (``weight``)."""

    def __init__(self, normalized_shape: int | tuple[int], eps: float | None = None,
                 device=None, dtype=None) -> None:
        super().__init__()
        n = normalized_shape if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if isinstance(n, tuple):
            if len(n) != 1:
                raise ValueError("FusedRMSNorm normalizes the last dimension only; got "
                                 f"normalized_shape={n}")
            n = n[0]
        self.normalized_shape, self.eps = (n,), eps
        self.weight = nn.Parameter(torch.ones(n, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"
