"""The device's FlexAttention kernel: block-sparse forward, and its exact backward.

Plain PyTorch on host tensors (the emulated device's memory), so it runs wherever the host
executor does — including the training case the host's own kernels lack (torch 2.13's CPU
FlexAttention is inference only, eager or compiled).

Block-sparse as the fused kernels are: for each query block only the key/value blocks the
``BlockMask`` lists are gathered and computed — partial blocks (``kv_indices``, ``mask_mod``
applied) and full blocks (``full_kv_indices``, no ``mask_mod``). Query blocks go in at most
``MAX_GROUPS`` groups by their block count, each padded to its longest list
(``Launch.computed`` counts the padded slots, the work really done; ``Launch.needed`` the
listed ones; ``Launch.total`` the dense grid). Within a
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
    """What a launch computes for one group of query blocks, from the block mask alone (no
    gradient flows through it)."""
    bl: Blocks
    qsel: Tensor           # [nG] the query blocks of this group
    n_kv: int
    N: int                 # kv block slots per query block of the group
    idx: Tensor            # [B,Hq,nG,N] kv block of each slot
    valid: Tensor          # [B,Hq,nG,qbs,N*kvbs] allowed pairs
    empty: Tensor          # [B,Hq,nG,qbs] rows with no allowed pair
    flat: list | None      # b, h, q_idx, kv_idx per element (for score_mod), or None


def _is_identity(fn) -> bool:
    if getattr(fn, "__name__", "") == "_identity":
        return True
    if isinstance(fn, torch.fx.GraphModule):
        phs = [n for n in fn.graph.nodes if n.op == "placeholder"]
        out = fn.graph.output_node().args[0]
        return bool(phs) and out is phs[0]
    return False


MAX_GROUPS = 3


def _groups(counts: list[int]) -> list[list[int]]:
    """Query blocks in at most ``MAX_GROUPS`` groups (by kv block count), each padded to its own
    longest list: the split with the fewest padded slots (a causal mask's 1..n blocks per
    query block pad to n in one group, to far less in three)."""
    order = sorted(range(len(counts)), key=lambda i: counts[i])
    c = [counts[i] for i in order]
    n = len(c)
    best = (n * (c[-1] if c else 0), [n])
    for i in range(1, n):
        for j in range(i, n):
            cuts = [i, j, n] if j > i else [i, n]
            work, lo = 0, 0
            for hi in cuts:
                work += (hi - lo) * c[hi - 1]
                lo = hi
            if work < best[0]:
                best = (work, cuts)
    groups, lo = [], 0
    for hi in best[1]:
        groups.append(order[lo:hi])
        lo = hi
    return groups


def _plan(q: Tensor, v: Tensor, bl: Blocks, mask_mod, mask_bufs, need_flat: bool):
    """The launch: its groups of query blocks (``_Plan`` each) and its ``Launch`` figures."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

    B, Hq, L, _ = q.shape
    S = v.shape[-2]
    dev = q.device
    # a block longer than the sequence is one block (no mask: FlexAttention's 2**30 "blocks")
    bl = bl._replace(q_bs=min(bl.q_bs, L), kv_bs=min(bl.kv_bs, S))
    n_q, n_kv = -(-L // bl.q_bs), -(-S // bl.kv_bs)
    idx_all, kind_all, needed = _slots(bl, n_kv)         # [Bm,Hm,nQB',N]
    idx_all, kind_all = idx_all[:, :, :n_q], kind_all[:, :, :n_q]
    counts = (kind_all > 0).sum(-1).amax(dim=(0, 1)).tolist()      # per query block
    plans, computed = [], 0
    for group in _groups(counts):
        N = max(max(counts[i] for i in group), 1)
        qsel = torch.tensor(group, dtype=torch.long, device=dev)
        nG = len(group)
        idx = idx_all[:, :, qsel, :N].expand(B, Hq, nG, N)
        kind = kind_all[:, :, qsel, :N].expand(B, Hq, nG, N)
        shape = (B, Hq, nG, bl.q_bs, N * bl.kv_bs)
        q_i = (qsel[:, None] * bl.q_bs + torch.arange(bl.q_bs, device=dev)).view(
            1, 1, nG, bl.q_bs, 1)
        kv_i = (idx[..., None] * bl.kv_bs + torch.arange(bl.kv_bs, device=dev)).reshape(
            B, Hq, nG, 1, N * bl.kv_bs)
        slot = kind.repeat_interleave(bl.kv_bs, dim=-1).view(B, Hq, nG, 1, N * bl.kv_bs)
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
        plans.append(_Plan(bl, qsel, n_kv, N, idx, valid, ~valid.any(-1),
                           flat if need_flat else None))
        computed += B * Hq * nG * N
    Bm, Hm = bl.kv_num.shape[:2]
    launch = Launch(computed=computed, needed=needed * (B // Bm) * (Hq // Hm),
                    total=B * Hq * n_q * n_kv)
    return plans, launch


def _attend_group(qb: Tensor, k: Tensor, v: Tensor, plan: _Plan, score_mod, scale: float,
                  score_bufs, out_dtype):
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

    B, Hq = qb.shape[:2]
    Bkv, Hkv, S, Ev = v.shape
    E = k.shape[-1]
    bl, n_kv, N = plan.bl, plan.n_kv, plan.N
    dev = qb.device
    wp = torch.float64 if out_dtype == torch.float64 else torch.float32
    kb = _pad_to(k, 2, n_kv * bl.kv_bs).reshape(Bkv, Hkv, n_kv, bl.kv_bs, E)
    vb = _pad_to(v, 2, n_kv * bl.kv_bs).reshape(Bkv, Hkv, n_kv, bl.kv_bs, Ev)
    bi = (torch.arange(B, device=dev) if Bkv == B else torch.zeros(B, dtype=torch.long,
                                                                    device=dev)).view(B, 1, 1, 1)
    hi = (torch.arange(Hq, device=dev) // (Hq // Hkv)).view(1, Hq, 1, 1)
    nG = plan.idx.shape[2]
    kg = kb[bi, hi, plan.idx].reshape(B, Hq, nG, N * bl.kv_bs, E)    # gathered kv blocks
    vg = vb[bi, hi, plan.idx].reshape(B, Hq, nG, N * bl.kv_bs, Ev)
    qg = qb.index_select(2, plan.qsel)
    scores = (qg.to(wp) @ kg.to(wp).transpose(-2, -1)) * scale       # [B,Hq,nG,qbs,N*kvbs]
    if plan.flat is not None:
        with TransformGetItemToIndex():
            scores = _vmapped(score_mod, 5, len(score_bufs))(
                scores.reshape(-1), *plan.flat, *score_bufs).view(scores.shape).to(wp)
    post = torch.where(plan.valid, scores, torch.tensor(-math.inf, dtype=wp, device=dev))
    empty = plan.empty
    lse = torch.where(empty, -math.inf, post.logsumexp(-1))
    mx = post.amax(-1)
    p = torch.where(empty[..., None], 0.0, torch.exp(post - lse.masked_fill(empty, 0)[..., None]))
    return p.to(out_dtype) @ vg.to(out_dtype), lse, mx              # [B,Hq,nG,qbs,Ev]


def _attend(q: Tensor, k: Tensor, v: Tensor, plans: list, score_mod, scale: float,
            score_bufs) -> tuple[Tensor, Tensor, Tensor]:
    """The differentiable part: per group, gather the planned blocks, score, mask, softmax,
    multiply; then the query blocks back in order."""
    B, Hq, L, E = q.shape
    Ev = v.shape[-1]
    q_bs = plans[0].bl.q_bs
    n_q = -(-L // q_bs)
    qb = _pad_to(q, 2, n_q * q_bs).reshape(B, Hq, n_q, q_bs, E)
    parts = [_attend_group(qb, k, v, pl, score_mod, scale, score_bufs, q.dtype) for pl in plans]
    if len(parts) == 1 and n_q == plans[0].qsel.numel():
        out, lse, mx = parts[0]
        inv = torch.argsort(plans[0].qsel)
        out, lse, mx = (t.index_select(2, inv) for t in (out, lse, mx))
    else:
        inv = torch.argsort(torch.cat([pl.qsel for pl in plans]))
        out, lse, mx = (torch.cat(ts, 2).index_select(2, inv) for ts in zip(*parts))
    out = out.reshape(B, Hq, n_q * q_bs, Ev)[:, :, :L]
    return (out, lse.reshape(B, Hq, -1)[:, :, :L] / _LN2, mx.reshape(B, Hq, -1)[:, :, :L] / _LN2)


def forward(q: Tensor, k: Tensor, v: Tensor, bl: Blocks, score_mod: Callable,
            mask_mod: Callable | None, scale: float, score_bufs=(), mask_bufs=(),
            record: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse / ln 2, max / ln 2) of FlexAttention for q [B,Hq,L,E], k [Bkv,Hkv,S,E],
    v [Bkv,Hkv,S,Ev] (GQA when Hq > Hkv; Bkv 1 broadcasts)."""
    plans, launch = _plan(q, v, bl, mask_mod, mask_bufs, need_flat=not _is_identity(score_mod))
    if record:
        _last.launch = launch
    return _attend(q, k, v, plans, score_mod, scale, score_bufs)


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
        plans, _ = _plan(q, v, bl, mask_mod, mask_bufs, need_flat=not _is_identity(score_mod))

    def f(q_, k_, v_, *grad_bufs):
        bufs = list(score_bufs)
        for i, t in zip(which, grad_bufs):
            bufs[i] = t
        out, lse, _ = _attend(q_, k_, v_, plans, score_mod, scale, bufs)
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
