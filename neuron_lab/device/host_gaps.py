"""Ops whose host (CPU) kernel lacks a dtype that Trainium, like CUDA, computes: done another way.

Library code takes accelerator-only branches on any device that is not CPU: Transformers' MoE
layers call ``torch.histc`` on *int* tensors off CPU ("histc does not support integer dtypes on
CPU"), which CPU's kernel refuses. A device must accept what an accelerator accepts, so for the
(op, dtype) pairs below the host computes the result another way instead of raising. Found by
comparing OpInfo's CUDA dtypes with CPU's, then checking which CPU kernels really refuse
(``tests/device/test_host_gaps.py`` re-checks that each gap still exists on the host, so a
substitute never hides a host kernel that has since appeared). Each substitute, per op:

- ``histc`` on an integer dtype: exact integer arithmetic, as CUDA's kernel: elements outside
  ``[min, max]`` are dropped, ``bin = (x - min) * bins // (max - min)`` in int64 (``x == max``
  goes to the last bin), counts summed with ``scatter_add`` (no data-dependent shape, so it also
  fuses); ``min == max`` takes the data's min and max (widened by 1 if equal); the result has
  the input's dtype. Bounds are truncated to integers, as CUDA converts them.
- ``abs``/``abs_`` on bool: the identity (``|b| == b``), as CUDA returns.
- ``trace`` on bool: the diagonal's sum, an int64 count, as CUDA's ``trace``.
- ``avg_pool3d``, ``_upsample_bilinear2d_aa``/``_upsample_bicubic2d_aa``, ``multi_margin_loss``,
  ``multilabel_margin_loss`` (forward and backward) on float16/bfloat16: computed in float32 and
  rounded once to the dtype, as CUDA's kernels accumulate these in float32 (``acc_type``).

Ops PyTorch calls only on accelerators, which have no CPU kernel at all: ``nn.LSTM``/``nn.GRU``
(and their cells) take the fused-cell path on any non-CPU device. ``_thnn_fused_lstm_cell``,
``_thnn_fused_gru_cell`` and their backwards are computed with CUDA's kernel formulas
(``aten/src/ATen/native/cuda/RNN.cu``) in float32 torch ops: the gate sums in CUDA's order
(``input_gates + hidden_gates + input_bias + hidden_bias``), the activations saved in a workspace
for the backward. Results equal CPU's unfused cell to float32 rounding, not bitwise (CPU adds
the biases inside its matmuls).

``out=`` overloads compute the functional result and copy it into ``out``. Every other dtype
takes the op's own host kernel. When the host executor is CUDA nothing is substituted (its
kernels have these dtypes). A dtype a host kernel still lacks raises a clear error naming the
op, the device and a fix (``kernels``).
"""
from __future__ import annotations

from typing import Callable

import torch

from .executor import host_device

Tensor = torch.Tensor
_INTS = frozenset({torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8})
_HALF = frozenset({torch.float16, torch.bfloat16})
_BOOL = frozenset({torch.bool})


def _histc(self: Tensor, bins: int = 100, min=0, max=0) -> Tensor:
    lo, hi = int(min), int(max)
    x = self.reshape(-1).to(torch.int64)
    if lo == hi and x.numel():
        lo, hi = int(x.min()), int(x.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if lo > hi:
        raise RuntimeError(f"histc: max must be larger than min (min={min}, max={max}) on "
                           f"device neuron:0")
    keep = (x >= lo) & (x <= hi)
    b = ((x - lo) * bins).div(hi - lo, rounding_mode="floor").clamp_(0, bins - 1)
    counts = torch.zeros(bins, dtype=torch.int64, device=x.device)
    counts.scatter_add_(0, b, keep.to(torch.int64))
    return counts.to(self.dtype)


def _abs(self: Tensor) -> Tensor:
    return self.clone()


def _abs_(self: Tensor) -> Tensor:
    return self


def _trace(self: Tensor) -> Tensor:
    return self.diagonal().sum()


def _gates(input_gates, hidden_gates, input_bias, hidden_bias, n):
    g = input_gates + hidden_gates
    if input_bias is not None:
        g = g + input_bias + hidden_bias
    return g.chunk(n, 1)


def _lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    i, f, c, o = _gates(input_gates, hidden_gates, input_bias, hidden_bias, 4)
    i, f, c, o = i.sigmoid(), f.sigmoid(), c.tanh(), o.sigmoid()
    cy = f * cx + i * c
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, c, o], 1)


def _lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, c, o = workspace.chunk(4, 1)
    go = grad_hy if grad_hy is not None else torch.zeros_like(cy)
    tc = cy.tanh()
    gcx = go * o * (1 - tc * tc)
    if grad_cy is not None:
        gcx = gcx + grad_cy
    gi, gf, gc = gcx * c, gcx * cx, gcx * i
    gates = torch.cat([gi * (1 - i) * i, gf * (1 - f) * f, gc * (1 - c * c),
                       go * tc * (1 - o) * o], 1)
    return gates, gcx * f, gates.sum(0) if has_bias else torch.zeros_like(gates[0])


def _gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ir, ii, in_ = input_gates.chunk(3, 1)
    hr, hi, hn = hidden_gates.chunk(3, 1)
    if input_bias is not None:
        (br, bi, bn), (cr, ci, cn) = input_bias.chunk(3), hidden_bias.chunk(3)
        ir, ii, in_, hr, hi, hn = ir + br, ii + bi, in_ + bn, hr + cr, hi + ci, hn + cn
    r, z = (ir + hr).sigmoid(), (ii + hi).sigmoid()
    n = (in_ + r * hn).tanh()
    return n + z * (hx - n), torch.cat([r, z, n, hx, hn], 1)


def _gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = workspace.chunk(5, 1)
    gz = grad_hy * (hx - n) * (1 - z) * z
    gin = grad_hy * (1 - z) * (1 - n * n)
    gr = gin * hn * (1 - r) * r
    gi, gh = torch.cat([gr, gz, gin], 1), torch.cat([gr, gz, gin * r], 1)
    if has_bias:
        return gi, gh, grad_hy * z, gi.sum(0), gh.sum(0)
    zero = torch.zeros_like(gi[0])
    return gi, gh, grad_hy * z, zero, zero


_MISSING: dict[str, Callable] = {
    "_thnn_fused_lstm_cell": _lstm_cell, "_thnn_fused_lstm_cell_backward_impl": _lstm_cell_backward,
    "_thnn_fused_gru_cell": _gru_cell, "_thnn_fused_gru_cell_backward": _gru_cell_backward,
}

_EXACT: dict[str, tuple[frozenset, Callable]] = {
    "histc": (_INTS, _histc), "abs": (_BOOL, _abs), "abs_": (_BOOL, _abs_),
    "trace": (_BOOL, _trace),
}
_UPCAST = frozenset({
    "avg_pool3d", "avg_pool3d_backward", "_upsample_bilinear2d_aa",
    "_upsample_bilinear2d_aa_backward", "_upsample_bicubic2d_aa", "_upsample_bicubic2d_aa_backward",
    "multi_margin_loss", "multi_margin_loss_backward", "multilabel_margin_loss_forward",
    "multilabel_margin_loss_backward",
})


def _lowp(args, kwargs):
    for a in (*args, *kwargs.values()):
        if type(a) is Tensor and a.dtype in _HALF:
            return a.dtype
    return None


def _upcast(op: torch._ops.OpOverload) -> Callable:
    call = op._op

    def run(*args, **kwargs):
        dt = _lowp(args, kwargs)
        if dt is None:
            return call(*args, **kwargs)
        up = [a.float() if type(a) is Tensor and a.dtype == dt else a for a in args]
        upk = {k: v.float() if type(v) is Tensor and v.dtype == dt else v
               for k, v in kwargs.items()}
        out = call(*up, **upk)
        if type(out) is tuple:
            return tuple(o.to(dt) if o.is_floating_point() else o for o in out)
        return out.to(dt)
    return run


def _exact(op: torch._ops.OpOverload, dtypes: frozenset, fn: Callable) -> Callable:
    call = op._op

    def run(*args, **kwargs):
        x = args[0] if args else next(iter(kwargs.values()))
        if x.dtype in dtypes:
            return fn(*args, **kwargs)
        return call(*args, **kwargs)
    return run


def _into_out(op: torch._ops.OpOverload, functional: Callable) -> Callable:
    """An ``out=`` overload: the functional substitute, copied into the out tensor(s)."""
    names = [a.name for a in op._schema.arguments if a.kwarg_only and a.alias_info is not None
             and a.alias_info.is_write]

    def run(*args, **kwargs):
        outs = [kwargs.pop(n) for n in names]
        res = functional(*args, **kwargs)
        res = res if type(res) is tuple else (res,)
        for o, r in zip(outs, res):
            if o.shape != r.shape:
                o.resize_(r.shape)
            o.copy_(r)
        return outs[0] if len(outs) == 1 else tuple(outs)
    return run


def substitute(op: torch._ops.OpOverload) -> Callable | None:
    """The host callable for ``op`` when its host kernel has a dtype gap, else None."""
    base = op._schema.name.split("::", 1)[1]
    if op.namespace != "aten" or (base not in _EXACT and base not in _UPCAST
                                  and base not in _MISSING):
        return None
    if host_device().type != "cpu":
        return None
    writes = any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
                 for a in op._schema.arguments)
    target = op.overloadpacket.default if writes else op
    if base in _MISSING:
        fn = _MISSING[base]
    elif base in _EXACT:
        fn = _exact(target, *_EXACT[base])
    else:
        fn = _upcast(target)
    return _into_out(op, fn) if writes else fn


def covered() -> dict[str, str]:
    """{op: dtypes computed another way}, for docs and tests."""
    out = {b: ", ".join(sorted(str(d)[6:] for d in dts)) for b, (dts, _) in _EXACT.items()}
    out.update({b: "float16, bfloat16" for b in sorted(_UPCAST)})
    out.update({b: "all (no CPU kernel)" for b in _MISSING})
    return out
