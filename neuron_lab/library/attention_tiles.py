"""The FlashAttention algorithm on tiles: forward with an online softmax, backward by recompute.

Device-agnostic PyTorch: the kernel bodies (flash_attention.py) call these on the host buffers
behind neuron tensors, and the memory check calls them on neuron tensors directly, so every tile
they allocate is counted by the device's allocator. Shapes: ``q`` (B, H, T, D), ``k``/``v``
(B, Hkv, S, D) with ``H % Hkv == 0`` (GQA; ``Hkv == 1`` is MQA). Query heads are viewed as
(B, Hkv, G, T, D), so a key tile broadcasts over its G query heads and is never copied per head.

Forward (FlashAttention-2): for each query tile of ``block_q`` rows, walk the key tiles of
``block_k`` columns that the mask leaves visible, keeping the running row max ``m``, the running
normaliser ``l`` and the unnormalised output; a new tile rescales them by ``exp(m_old - m_new)``.
Only a (block_q × block_k) score tile per (batch, head) exists at a time; T × S never does. The
forward returns the output and the per-row log-sum-exp ``lse = m + log(l)`` (float32; float64
for float64 inputs).

Backward: ``D = rowsum(dO ∘ O)``; for each key tile, for each visible query tile, recompute
``P = exp(S - lse)`` and accumulate ``dV += Pᵀ dO``, ``dS = P ∘ (dP - D)``, ``dQ += dS K``,
``dK += dSᵀ Q`` (dropout: ``P`` and ``dP`` are scaled by the same keep mask).

Masks, with query row ``i`` at position ``i + (S - T)`` (bottom-right aligned, as FlashAttention
and a KV cache have it; for T == S that is the usual causal mask):
``causal``: key ``j`` visible iff ``j <= pos(i)``; ``window`` w: visible iff ``pos(i) - j < w``
(the query and the w - 1 keys before it) and, when not causal, also ``j - pos(i) < w``.
Tiles with no visible entry are skipped (their FLOPs are not spent); tiles entirely visible get
no mask. A row with no visible key outputs 0 and has ``lse = -inf``.

Dropout: the keep mask is a counter-based hash of (seed, global head, row, column), so the
backward regenerates each tile's mask instead of storing T × S bits (as FlashAttention's Philox
offsets do). ``keep_mask`` builds the whole mask for a reference check.

Arithmetic is in float32 for 16-bit inputs (the input's dtype if wider: float64 on the host for
gradcheck); outputs are cast back to the input dtype.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

_M32 = 0xFFFFFFFF


class Mask(NamedTuple):
    """The attention mask of one (query, key) segment pair, as rules (never as a matrix)."""
    causal: bool
    window: int           # -1: none
    offset: int           # position of query row 0 among the keys: S - T


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def tile_visibility(mask: Mask, i0: int, i1: int, j0: int, j1: int) -> int:
    """0: no visible entry in rows [i0, i1) x keys [j0, j1); 1: some; 2: all."""
    lo, hi = i0 + mask.offset, i1 - 1 + mask.offset         # query positions in the tile
    w = mask.window
    if mask.causal and j0 > hi:
        return 0
    if w > 0 and (lo - (j1 - 1) >= w or (not mask.causal and j0 - hi >= w)):
        return 0
    full = (not mask.causal or j1 - 1 <= lo) and \
        (w <= 0 or (hi - j0 < w and (mask.causal or j1 - 1 - lo < w)))
    return 2 if full else 1


def _allowed(mask: Mask, i0: int, i1: int, j0: int, j1: int, device) -> Tensor:
    pos = torch.arange(i0, i1, device=device).unsqueeze(1) + mask.offset
    key = torch.arange(j0, j1, device=device).unsqueeze(0)
    ok = torch.ones(i1 - i0, j1 - j0, dtype=torch.bool, device=device)
    if mask.causal:
        ok &= key <= pos
    if mask.window > 0:
        ok &= (pos - key) < mask.window
        if not mask.causal:
            ok &= (key - pos) < mask.window
    return ok


def _hash(x: Tensor) -> Tensor:
    """lowbias32-style avalanche on int64 values below 2**32 (products stay below 2**63)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 16)


def tile_keep(seed: int, p: float, heads: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """Dropout keep mask (bool) for global head ids ``heads`` (broadcastable, e.g. B×Hkv×G×1×1),
    row ids ``rows`` (…×Br×1) and column ids ``cols`` (…×1×Bc): kept with probability 1 - p."""
    lo, hi = seed & _M32, (seed >> 32) & _M32
    x = (rows * 0x9E3779B1 + cols * 0x85EBCA77 + heads * 0x27D4EB2F + lo) & _M32
    x = _hash(_hash(x) ^ hi)
    return x >= int(p * 2 ** 32)


def keep_mask(seed: int, p: float, batch: int, heads: int, t: int, s: int,
              row0: int = 0, col0: int = 0, device=None) -> Tensor:
    """The whole (batch, heads, t, s) keep mask of a segment: for reference checks only."""
    h = torch.arange(batch * heads, device=device).view(batch, heads, 1, 1)
    r = torch.arange(row0, row0 + t, device=device).view(1, 1, t, 1)
    c = torch.arange(col0, col0 + s, device=device).view(1, 1, 1, s)
    return tile_keep(seed, p, h, r, c)


class Dropout(NamedTuple):
    p: float
    seed: int
    row0: int             # global row / column of this segment's first query / key
    col0: int


def _heads(b: int, hkv: int, g: int, device) -> Tensor:
    return torch.arange(b * hkv * g, device=device).view(b, hkv, g, 1, 1)


def forward(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Mask, drop: Dropout | None,
            block_q: int, block_k: int) -> tuple[Tensor, Tensor]:
    """(out, lse) of one segment; ``out`` in q's dtype, ``lse`` (B, H, T) in ``acc_dtype``."""
    b, h, t, d = q.shape
    hkv, s, dv = k.shape[1], k.shape[2], v.shape[-1]
    g, acc = h // hkv, acc_dtype(q.dtype)
    qg = q.unflatten(1, (hkv, g))
    kk, vv = k.unsqueeze(2), v.unsqueeze(2)                  # (B, Hkv, 1, S, D): broadcast
    out = q.new_empty((b, hkv, g, t, dv))
    lse = torch.empty((b, hkv, g, t), dtype=acc, device=q.device)
    heads = _heads(b, hkv, g, q.device) if drop else None
    for i0 in range(0, t, block_q):
        i1 = min(i0 + block_q, t)
        qi = qg[..., i0:i1, :].to(acc) * scale
        m = torch.full((b, hkv, g, i1 - i0), -math.inf, dtype=acc, device=q.device)
        l = torch.zeros_like(m)
        o = torch.zeros((b, hkv, g, i1 - i0, dv), dtype=acc, device=q.device)
        for j0 in range(0, s, block_k):
            j1 = min(j0 + block_k, s)
            vis = tile_visibility(mask, i0, i1, j0, j1)
            if vis == 0:
                continue
            sc = qi @ kk[..., j0:j1, :].to(acc).transpose(-1, -2)
            if vis == 1:
                sc = sc.masked_fill(~_allowed(mask, i0, i1, j0, j1, q.device), -math.inf)
            m_new = torch.maximum(m, sc.amax(-1))
            m_safe = m_new.masked_fill(m_new == -math.inf, 0.0)
            p = torch.exp(sc - m_safe.unsqueeze(-1))
            alpha = torch.exp(m - m_safe)
            l = l * alpha + p.sum(-1)
            if drop is not None:
                keep = tile_keep(drop.seed, drop.p, heads,
                                 torch.arange(i0, i1, device=q.device).view(-1, 1) + drop.row0,
                                 torch.arange(j0, j1, device=q.device).view(1, -1) + drop.col0)
                p = p * keep / (1.0 - drop.p)
            o = o * alpha.unsqueeze(-1) + p @ vv[..., j0:j1, :].to(acc)
            m = m_new
        empty = l == 0
        l1 = l.masked_fill(empty, 1.0)
        out[..., i0:i1, :] = (o / l1.unsqueeze(-1)).to(q.dtype)
        lse[..., i0:i1] = torch.where(empty, -math.inf, m.masked_fill(empty, 0.0) + torch.log(l1))
    return out.flatten(1, 2), lse.flatten(1, 2)


def backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
             scale: float, mask: Mask, drop: Dropout | None, block_q: int, block_k: int
             ) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of one segment, each in its input's dtype."""
    b, h, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g, acc = h // hkv, acc_dtype(q.dtype)
    qg, dog = q.unflatten(1, (hkv, g)), grad.unflatten(1, (hkv, g))
    delta = (grad.to(acc) * out.to(acc)).sum(-1).unflatten(1, (hkv, g))   # (B, Hkv, G, T)
    lse_g = lse.unflatten(1, (hkv, g)).to(acc)
    lse_g = lse_g.masked_fill(lse_g == -math.inf, math.inf)   # empty rows: P = exp(-inf) = 0
    dq = torch.zeros((b, hkv, g, t, d), dtype=acc, device=q.device)
    dk, dv = k.new_empty(k.shape), v.new_empty(v.shape)          # contiguous, as the fake says
    heads = _heads(b, hkv, g, q.device) if drop else None
    for j0 in range(0, s, block_k):
        j1 = min(j0 + block_k, s)
        kj = k[:, :, None, j0:j1, :].to(acc)
        vj = v[:, :, None, j0:j1, :].to(acc)
        dkj = torch.zeros((b, hkv, j1 - j0, d), dtype=acc, device=q.device)
        dvj = torch.zeros((b, hkv, j1 - j0, v.shape[-1]), dtype=acc, device=q.device)
        for i0 in range(0, t, block_q):
            i1 = min(i0 + block_q, t)
            vis = tile_visibility(mask, i0, i1, j0, j1)
            if vis == 0:
                continue
            qi = qg[..., i0:i1, :].to(acc)
            doi = dog[..., i0:i1, :].to(acc)
            sc = (qi * scale) @ kj.transpose(-1, -2)
            if vis == 1:
                sc = sc.masked_fill(~_allowed(mask, i0, i1, j0, j1, q.device), -math.inf)
            p = torch.exp(sc - lse_g[..., i0:i1].unsqueeze(-1))
            dp = doi @ vj.transpose(-1, -2)
            if drop is not None:
                keep = tile_keep(drop.seed, drop.p, heads,
                                 torch.arange(i0, i1, device=q.device).view(-1, 1) + drop.row0,
                                 torch.arange(j0, j1, device=q.device).view(1, -1) + drop.col0)
                z = keep.to(acc) / (1.0 - drop.p)
                dvj += ((p * z).transpose(-1, -2) @ doi).sum(2)
                dp = dp * z
            else:
                dvj += (p.transpose(-1, -2) @ doi).sum(2)
            ds = p * (dp - delta[..., i0:i1].unsqueeze(-1))
            dq[..., i0:i1, :] += (ds @ kj) * scale
            dkj += (ds.transpose(-1, -2) @ qi).sum(2) * scale
        dk[:, :, j0:j1] = dkj.to(k.dtype)
        dv[:, :, j0:j1] = dvj.to(v.dtype)
    return dq.flatten(1, 2).to(q.dtype), dk, dv


def tile_counts(t: int, s: int, mask: Mask, block_q: int, block_k: int) -> tuple[int, int]:
    """(visible tiles, visible score entries) of one segment: what the kernel computes."""
    tiles = entries = 0
    for i0 in range(0, t, block_q):
        i1 = min(i0 + block_q, t)
        for j0 in range(0, s, block_k):
            j1 = min(j0 + block_k, s)
            if tile_visibility(mask, i0, i1, j0, j1):
                tiles += 1
                entries += (i1 - i0) * (j1 - j0)
    return tiles, entries
