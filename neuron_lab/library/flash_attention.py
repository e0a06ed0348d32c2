"""``flash_attention``: FlashAttention as two device kernels (forward, backward) with autograd.

The algorithm is attention_tiles.py's: an online softmax over (block_q × block_k) score tiles;
the forward saves only the output and the per-row log-sum-exp, the backward recomputes each
tile's probabilities from them. Nothing of size T × S is ever allocated, by the kernels or by
autograd (which saves q, k, v, out, lse).

``neuron_lab::flash_attention_fwd`` and ``neuron_lab::flash_attention_bwd`` are ``kernel``s
(device/custom_kernels.py): in ``eager`` mode each is one launch, in ``adaptive`` mode an
opaque op of a region, under ``torch.compile`` one graph node each (forward in the forward
graph, backward in the backward graph).

Inputs are (B, H, T, D) like ``scaled_dot_product_attention``'s; k and v may have fewer heads
(GQA, MQA). Variable sequence lengths are packed: ``cu_seqlens_q``/``cu_seqlens_k`` (int, one
more than the number of sequences, starting at 0, as flash-attn's ``varlen`` API) with B == 1;
each sequence attends only to itself. Masks are rules (``causal``, ``window``), see
attention_tiles.py. Dropout draws one seed per call on the host generator (so
``torch.manual_seed`` makes it reproducible); the backward regenerates the same mask from it.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ..device.custom_kernels import kernel
from . import attention_tiles as tiles

# Tile sizes (rows of q, columns of k per tile). On Trainium a tile would fill the 128 partitions
# of SBUF; here they bound the workspace: one (block_q × block_k) float32 tile per head.
BLOCK_Q = 128
BLOCK_K = 128

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_HOST_ONLY = (torch.float64,)          # the host reference (gradcheck); Trainium has no float64


def _segments(t: int, s: int, cu_q: Optional[Tensor], cu_k: Optional[Tensor]):
    """[(q0, q1, k0, k1)]: the packed sequences (or the one whole sequence)."""
    if cu_q is None:
        return [(0, t, 0, s)]
    qs, ks = cu_q.tolist(), cu_k.tolist()
    return [(qs[n], qs[n + 1], ks[n], ks[n + 1]) for n in range(len(qs) - 1)]


def _dropout(p: float, seed: Optional[Tensor], q0: int, k0: int):
    return tiles.Dropout(p, int(seed), q0, k0) if p > 0 else None


@kernel("neuron_lab::flash_attention_fwd", mutates_args=())
def flash_attention_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
                        cu_seqlens_k: Optional[Tensor], seed: Optional[Tensor], scale: float,
                        causal: bool, window: int, dropout_p: float, block_q: int, block_k: int
                        ) -> tuple[Tensor, Tensor]:
    b, h, t, _ = q.shape
    segs = _segments(t, k.shape[2], cu_seqlens_q, cu_seqlens_k)
    if len(segs) == 1 and segs[0] == (0, t, 0, k.shape[2]):
        mask = tiles.Mask(causal, window, k.shape[2] - t)
        return tiles.forward(q, k, v, scale, mask, _dropout(dropout_p, seed, 0, 0),
                             block_q, block_k)
    out = q.new_zeros((b, h, t, v.shape[-1]))
    lse = torch.full((b, h, t), -math.inf, dtype=tiles.acc_dtype(q.dtype), device=q.device)
    for q0, q1, k0, k1 in segs:
        if q1 == q0:
            continue
        mask = tiles.Mask(causal, window, (k1 - k0) - (q1 - q0))
        o, l = tiles.forward(q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], scale, mask,
                             _dropout(dropout_p, seed, q0, k0), block_q, block_k)
        out[:, :, q0:q1], lse[:, :, q0:q1] = o, l
    return out, lse


@flash_attention_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, seed, scale, causal, window, dropout_p, block_q,
      block_k):
    b, h, t, _ = q.shape
    return (q.new_empty((b, h, t, v.shape[-1])),
            q.new_empty((b, h, t), dtype=tiles.acc_dtype(q.dtype)))


@kernel("neuron_lab::flash_attention_bwd", mutates_args=())
def flash_attention_bwd(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                        cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                        seed: Optional[Tensor], scale: float, causal: bool, window: int,
                        dropout_p: float, block_q: int, block_k: int
                        ) -> tuple[Tensor, Tensor, Tensor]:
    t, s = q.shape[2], k.shape[2]
    segs = _segments(t, s, cu_seqlens_q, cu_seqlens_k)
    if len(segs) == 1 and segs[0] == (0, t, 0, s):
        mask = tiles.Mask(causal, window, s - t)
        return tiles.backward(grad, q, k, v, out, lse, scale, mask,
                              _dropout(dropout_p, seed, 0, 0), block_q, block_k)
    dq, dk, dv = q.new_zeros(q.shape), k.new_zeros(k.shape), v.new_zeros(v.shape)
    for q0, q1, k0, k1 in segs:
        if q1 == q0 or k1 == k0:
            continue
        mask = tiles.Mask(causal, window, (k1 - k0) - (q1 - q0))
        a, b_, c = tiles.backward(grad[:, :, q0:q1], q[:, :, q0:q1], k[:, :, k0:k1],
                                  v[:, :, k0:k1], out[:, :, q0:q1], lse[:, :, q0:q1], scale, mask,
                                  _dropout(dropout_p, seed, q0, k0), block_q, block_k)
        dq[:, :, q0:q1], dk[:, :, k0:k1], dv[:, :, k0:k1] = a, b_, c
    return dq, dk, dv


@flash_attention_bwd.register_fake
def _(grad, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seed, scale, causal, window,
      dropout_p, block_q, block_k):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)   # contiguous


def _setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, seed, scale, causal, window, p, bq, bk = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_q, cu_k, seed)
    ctx.args = (scale, causal, window, p, bq, bk)


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, out, lse, cu_q, cu_k, seed = ctx.saved_tensors
    dq, dk, dv = flash_attention_bwd(grad_out.contiguous(), q, k, v, out, lse, cu_q, cu_k, seed,
                                     *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None


flash_attention_fwd.register_autograd(_backward, setup_context=_setup)


def _fail(msg: str, q: Tensor) -> ValueError:
    return ValueError(f"neuron_lab.library.flash_attention on {q.device}: {msg}")


def _check(q: Tensor, k: Tensor, v: Tensor, window, cu_q, cu_k) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise _fail(f"expects (batch, heads, seq, head_dim) tensors; got q {tuple(q.shape)}, "
                    f"k {tuple(k.shape)}, v {tuple(v.shape)}. Fix: transpose (B, T, H, D) "
                    "inputs with .transpose(1, 2)", q)
    if not (q.dtype == k.dtype == v.dtype):
        raise _fail(f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype}). Fix: cast them "
                    "to one dtype", q)
    allowed = DTYPES + (_HOST_ONLY if q.device.type != "neuron" else ())
    if q.dtype not in allowed:
        raise _fail(f"dtype {q.dtype} is not supported (the device computes in "
                    f"{', '.join(str(d).removeprefix('torch.') for d in DTYPES)}). Fix: "
                    "q.to(torch.bfloat16) or float32", q)
    if q.shape[0] != k.shape[0] or k.shape[:3] != v.shape[:3] or q.shape[-1] != k.shape[-1]:
        raise _fail(f"shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, "
                    f"v {tuple(v.shape)}. Fix: give k and v the same (batch, heads, length), "
                    "and q and k the same batch and head_dim", q)
    if q.shape[1] % k.shape[1]:
        raise _fail(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} key/value "
                    "heads. Fix: a number of key/value heads that divides the query heads", q)
    if window is not None and (not isinstance(window, int) or window < 1):
        raise _fail(f"window={window!r}. Fix: None (no window) or an int >= 1", q)
    if (cu_q is None) != (cu_k is None):
        raise _fail("one of cu_seqlens_q, cu_seqlens_k given. Fix: pass both, or neither", q)
    if cu_q is not None and (q.shape[0] != 1 or cu_q.dim() != 1 or cu_q.shape != cu_k.shape):
        raise _fail("packed sequences need batch 1 and 1-D cu_seqlens_q, cu_seqlens_k of equal "
                    f"length; got q {tuple(q.shape)}, cu_seqlens_q {tuple(cu_q.shape)}, "
                    f"cu_seqlens_k {tuple(cu_k.shape)}. Fix: pack the sequences into one row "
                    "(1, H, total, D)", q)


def _draw_seed() -> Tensor:
    """One dropout seed, drawn now on the host generator (where eager draws its randomness)."""
    return torch.randint(0, 2 ** 62, (), dtype=torch.int64, device="cpu")


def flash_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                    window: int | None = None, scale: float | None = None,
                    dropout_p: float = 0.0, *, cu_seqlens_q: Tensor | None = None,
                    cu_seqlens_k: Tensor | None = None) -> Tensor:
    """Attention of ``q`` (B, H, T, D) over ``k``, ``v`` (B, Hkv, S, D) without the T × S matrix.

    ``causal``: query i sees keys up to its position (bottom-right aligned when T != S);
    ``window``: also only the ``window`` most recent keys (both sides when not causal);
    ``scale``: default 1/sqrt(D); ``dropout_p``: dropout on the attention probabilities;
    ``cu_seqlens_q``/``cu_seqlens_k``: packed variable-length sequences (B == 1).
    Equals ``scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)`` for
    T == S (float32 tolerance: the softmax is summed tile by tile).
    """
    _check(q, k, v, window, cu_seqlens_q, cu_seqlens_k)
    if not 0.0 <= dropout_p < 1.0:
        raise _fail(f"dropout_p={dropout_p}. Fix: a probability in [0, 1)", q)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    seed = _draw_seed() if dropout_p > 0 else None
    out, _lse = flash_attention_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seed, scale,
                                    bool(causal), -1 if window is None else int(window),
                                    float(dropout_p), BLOCK_Q, BLOCK_K)
    return out
