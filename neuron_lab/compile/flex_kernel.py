"""The device's FlexAttention kernel: block-sparse forward, and its exact backward.

Plain PyTorch on host tensors (the emulated device's memory), so it runs wherever the host
executor does — including the training case the host's own kernels lack (torch 2.13's CPU
FlexAttention is inference only, eager or compiled).

Block-sparse as the fused kernels are: for each query block only the key/value blocks the
``BlockMask`` lists are gathered and computed — partial blocks (``kv_indices``, ``mask_mod``
applied) and full blocks (``full_kv_indices``, no ``mask_mod``) — padded per launch to the
largest count of any query block (``Launch.computed`` counts the padded slots, the work
really done; ``Launch.needed`` the listed ones; ``Launch.total`` the dense grid). Within a
block the math is ``_math_attention_inner``'s (PyTorch's eager reference): scores in float32,
``score_mod`` vectorised with ``vmap`` over every element, masked entries -inf, a safe softmax
(fully masked rows give 0 and lse -inf), probabilities cast to the query's dtype for the
product with V. The log-sum-exp and max are returned in log2 units, as the HOP's are.

The backward recomputes that forward and takes its vector-Jacobian product (``torch.func.vjp``):
gradients for q, k, v and any ``score_mod`` buffer that requires grad, exact for the forward
computed (no approximation of the softmax).
"""
from __future__ import annotations

import math
import threading
from typing import Callable, NamedTuple

import torch
from torch import Tensor

_LN2 = math.log(2.0)


class Blocks(NamedTuple):
    """The block sparsity a launch uses (a ``BlockMask``'s kv side)."""
    kv_num: Tensor                 # [Bm, Hm, nQB] partial blocks per query block
    kv_idx: Tensor                 # [Bm, Hm, nQB, nKVB]
    full_num: Tensor | None        # [Bm, Hm, nQB] full blocks per query block
    full_idx: Tensor | None
    q_bs: int
    kv_bs: int


class Launch(NamedTuple):
    """What one kernel launch computed: block pairs (one query block x one kv block)."""
    computed: int      # gathered slots, padding included: the work done
    needed: int        # blocks the mask lists (partial + full)
    total: int         # the dense grid: B * H * nQB * nKVB


_last = threading.local()      # per thread: the adaptive runtime may run kernels on workers


def last_launch() -> Launch | None:
    """The last forward launch's blocks, on this thread."""
    return getattr(_last, "launch", None)


def _slots(bl: Blocks, n_kv_blocks: int):
    """Per (b, h, query block): the kv block of each slot, and its kind (0 padding, 1 partial,
    2 full)."""
    p = bl.kv_num.long()
    f = bl.full_num.long() if bl.full_num is not None else torch.zeros_like(p)
    count = p + f
    n = max(int(count.max()) if count.numel() else 0, 1)
    pos = torch.arange(n, device=p.device)
    width = bl.kv_idx.shape[-1]
    shape = (*p.shape, n)
    ip = bl.kv_idx.long().gather(-1, pos.clamp(max=width - 1).expand(shape))
    is_p = pos < p[..., None]
    is_f = ~is_p & (pos < count[..., None])
    idx = torch.where(is_p, ip, 0)
    if bl.full_idx is not None:
        fw = bl.full_idx.shape[-1]
        fpos = (pos - p[..., None]).clamp(0, fw - 1)
        idx = torch.where(is_f, bl.full_idx.long().gather(-1, fpos), idx)
    kind = is_p.to(torch.int8) + 2 * is_f.to(torch.int8)
    return idx.clamp(max=n_kv_blocks - 1), kind, int(count.sum())


def _pad_to(x: Tensor, dim: int, size: int) -> Tensor:
    extra = size - x.shape[dim]
    if extra == 0:
        return x
    pad = [0, 0] * (x.dim() - 1 - dim) + [0, extra]
    return torch.nn.functional.pad(x, pad)


def _vmapped(fn: Callable, n_lead: int, n_bufs: int) -> Callable:
    """``fn`` over flat element vectors: the first ``n_lead`` arguments batched, buffers not."""
    return torch.vmap(fn, in_dims=(0,) * n_lead + (None,) * n_bufs)


class _Plan(NamedTuple):
    """What a launch computes, from the block mask alone (no gradient flows through it)."""
    bl: Blocks
    n_q: int
    n_kv: int
    N: int                 # kv block slots per query block
    idx: Tensor            # [B,Hq,nQ,N] kv block of each slot
    valid: Tensor          # [B,Hq,nQ,qbs,N*kvbs] allowed pairs
    empty: Tensor          # [B,Hq,nQ,qbs] rows with no allowed pair
    flat: list | None      # b, h, q_idx, kv_idx per element (for score_mod), or None
    launch: Launch


def _is_identity(fn) -> bool:
    if getattr(fn, "__name__", "") == "_identity":
        return True
    if isinstance(fn, torch.fx.GraphModule):
        phs = [n for n in fn.graph.nodes if n.op == "placeholder"]
        out = fn.graph.output_node().args[0]
        return bool(phs) and out is phs[0]
    return False


def _plan(q: Tensor, v: Tensor, bl: Blocks, mask_mod, mask_bufs, need_flat: bool) -> _Plan:
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

    B, Hq, L, _ = q.shape
    S = v.shape[-2]
    dev = q.device
    # a block longer than the sequence is one block (no mask: FlexAttention's 2**30 "blocks")
    bl = bl._replace(q_bs=min(bl.q_bs, L), kv_bs=min(bl.kv_bs, S))
    n_q, n_kv = -(-L // bl.q_bs), -(-S // bl.kv_bs)
    idx, kind, needed = _slots(bl, n_kv)                 # [Bm,Hm,nQB',N]
    idx, kind = idx[:, :, :n_q], kind[:, :, :n_q]
    N = idx.shape[-1]
    idx = idx.expand(B, Hq, n_q, N)
    kind = kind.expand(B, Hq, n_q, N)
    shape = (B, Hq, n_q, bl.q_bs, N * bl.kv_bs)
    q_i = torch.arange(n_q * bl.q_bs, device=dev).view(1, 1, n_q, bl.q_bs, 1)
    kv_i = (idx[..., None] * bl.kv_bs + torch.arange(bl.kv_bs, device=dev)).reshape(
        B, Hq, n_q, 1, N * bl.kv_bs)
    slot = kind.repeat_interleave(bl.kv_bs, dim=-1).view(B, Hq, n_q, 1, N * bl.kv_bs)
    valid = (slot > 0) & (q_i < L) & (kv_i < S)
    partial = mask_mod is not None and bool((kind == 1).any())
    flat = None
    if partial or need_flat:
        b_i = torch.arange(B, device=dev).view(B, 1, 1, 1, 1)
        h_i = torch.arange(Hq, device=dev).view(1, Hq, 1, 1, 1)
        flat = [t.expand(shape).reshape(-1) for t in (b_i, h_i, q_i.clamp(max=L - 1),
                                                       kv_i.clamp(max=S - 1))]
    if partial:
        with TransformGetItemToIndex():
            m = _vmapped(mask_mod, 4, len(mask_bufs))(*flat, *mask_bufs).view(shape)
        valid = valid & ((slot == 2) | m)
    valid = valid.expand(shape)
    Bm, Hm = bl.kv_num.shape[:2]
    launch = Launch(computed=B * Hq * n_q * N, needed=needed * (B // Bm) * (Hq // Hm),
                    total=B * Hq * n_q * n_kv)
    return _Plan(bl, n_q, n_kv, N, idx, valid, ~valid.any(-1),
                 flat if need_flat else None, launch)


def _attend(q: Tensor, k: Tensor, v: Tensor, plan: _Plan, score_mod, scale: float,
            score_bufs) -> tuple[Tensor, Tensor, Tensor]:
    """The differentiable part: gather the planned blocks, score, mask, softmax, multiply."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

    B, Hq, L, E = q.shape
    Bkv, Hkv, S, Ev = v.shape
    bl, n_q, n_kv, N = plan.bl, plan.n_q, plan.n_kv, plan.N
    dev = q.device
    wp = torch.float64 if q.dtype == torch.float64 else torch.float32
    kb = _pad_to(k, 2, n_kv * bl.kv_bs).reshape(Bkv, Hkv, n_kv, bl.kv_bs, E)
    vb = _pad_to(v, 2, n_kv * bl.kv_bs).reshape(Bkv, Hkv, n_kv, bl.kv_bs, Ev)
    bi = (torch.arange(B, device=dev) if Bkv == B else torch.zeros(B, dtype=torch.long,
                                                                    device=dev)).view(B, 1, 1, 1)
    hi = (torch.arange(Hq, device=dev) // (Hq // Hkv)).view(1, Hq, 1, 1)
    kg = kb[bi, hi, plan.idx].reshape(B, Hq, n_q, N * bl.kv_bs, E)   # gathered kv blocks
    vg = vb[bi, hi, plan.idx].reshape(B, Hq, n_q, N * bl.kv_bs, Ev)
    qb = _pad_to(q, 2, n_q * bl.q_bs).reshape(B, Hq, n_q, bl.q_bs, E)
    scores = (qb.to(wp) @ kg.to(wp).transpose(-2, -1)) * scale       # [B,Hq,nQ,qbs,N*kvbs]
    if plan.flat is not None:
        with TransformGetItemToIndex():
            scores = _vmapped(score_mod, 5, len(score_bufs))(
                scores.reshape(-1), *plan.flat, *score_bufs).view(scores.shape).to(wp)
    post = torch.where(plan.valid, scores, torch.tensor(-math.inf, dtype=wp, device=dev))
    empty = plan.empty
    lse = torch.where(empty, -math.inf, post.logsumexp(-1))
    mx = post.amax(-1)
    p = torch.where(empty[..., None], 0.0, torch.exp(post - lse.masked_fill(empty, 0)[..., None]))
    out = p.to(q.dtype) @ vg.to(q.dtype)                              # [B,Hq,nQ,qbs,Ev]
    out = out.reshape(B, Hq, n_q * bl.q_bs, Ev)[:, :, :L]
    return (out, lse.reshape(B, Hq, -1)[:, :, :L] / _LN2, mx.reshape(B, Hq, -1)[:, :, :L] / _LN2)


def forward(q: Tensor, k: Tensor, v: Tensor, bl: Blocks, score_mod: Callable,
            mask_mod: Callable | None, scale: float, score_bufs=(), mask_bufs=(),
            record: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse / ln 2, max / ln 2) of FlexAttention for q [B,Hq,L,E], k [Bkv,Hkv,S,E],
    v [Bkv,Hkv,S,Ev] (GQA when Hq > Hkv; Bkv 1 broadcasts)."""
    plan = _plan(q, v, bl, mask_mod, mask_bufs, need_flat=not _is_identity(score_mod))
    if record:
        _last.launch = plan.launch
    return _attend(q, k, v, plan, score_mod, scale, score_bufs)


def backward(q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor | None,
             grad_lse: Tensor | None, bl: Blocks, score_mod: Callable,
             mask_mod: Callable | None, scale: float, score_bufs=(), mask_bufs=(),
             buf_grad: tuple[bool, ...] = ()) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    """Gradients of ``forward``'s (out, lse/ln2) for q, k, v and the score buffers flagged in
    ``buf_grad``: the vector-Jacobian product of the recomputed forward (the plan — which
    pairs are allowed — is computed once, outside it)."""
    score_bufs = list(score_bufs)
    which = [i for i, g in enumerate(buf_grad) if g and i < len(score_bufs)]
    with torch.no_grad():
        plan = _plan(q, v, bl, mask_mod, mask_bufs, need_flat=not _is_identity(score_mod))

    def f(q_, k_, v_, *grad_bufs):
        bufs = list(score_bufs)
        for i, t in zip(which, grad_bufs):
            bufs[i] = t
        out, lse, _ = _attend(q_, k_, v_, plan, score_mod, scale, bufs)
        return out, lse

    with torch.enable_grad():
        (out, lse), vjp_fn = torch.func.vjp(f, q, k, v, *(score_bufs[i] for i in which))
        go = torch.zeros_like(out) if grad_out is None else grad_out.to(out.dtype)
        gl = torch.zeros_like(lse) if grad_lse is None else grad_lse.to(lse.dtype)
        # fully masked rows: lse is -inf and carries no gradient
        gl = torch.where(torch.isinf(lse), 0.0, gl)
        grads = vjp_fn((go, gl))
    gq, gk, gv, *gb = grads
    return gq, gk, gv, list(gb)
