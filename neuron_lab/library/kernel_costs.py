"""What the library's kernels cost on the modelled chip: the bytes and FLOPs each one moves.

The cost model (telemetry/cost_model.py) prices a launch as ``overhead + max(bytes / HBM
bandwidth, FLOPs / peak)``. For an ATen op it counts every input and output once and takes
FLOPs from PyTorch's formulas; a custom kernel needs its own count, registered here two ways:

- FLOPs through PyTorch's own registry (``torch.utils.flop_counter.register_flop_formula``),
  which the cost model, ``FlopCounterMode`` and the adaptive runtime's region costing read;
- bytes through the cost model's ``KERNEL_COSTS`` hook (op packet -> ``Cost``), read by
  ``op_cost`` (``estimate()``, profiles), filled when the cost model is imported. Inside a
  fused region the region's own rule applies (its inputs and outputs), with these FLOPs.

FlashAttention (tiles as the kernel runs them, attention_tiles.py): the forward reads each
query tile once and, per visible (query tile, key tile) pair, one key and one value tile (a key
tile is shared by the G query heads of its group), and writes the output and the log-sum-exp;
FLOPs ``4·B·H·E·D`` for E visible score entries (masked tiles are skipped). The backward reads
each key/value tile once and per visible pair the query, output-gradient, lse and
``D = rowsum(dO∘O)`` rows, and reads and writes the float32 dQ accumulator; ``10·B·H·E·D``.
``unfused_attention`` prices the path without the kernel: ``sdpa``'s math decomposition as the
separate launches it is, with the T × S scores written and read back between them.

MoE: routing reads the logits and writes k weights and ids per token; permute reads each token
once per slot and writes its row; the grouped GEMM reads the rows, the weights of the experts
that received rows and writes the result, ``2·M·N·K`` FLOPs over the kept rows;
unpermute reads the kept rows and weights and writes one row per token.
"""
from __future__ import annotations

import functools

import torch
from torch.utils.flop_counter import flop_registry, register_flop_formula

from . import attention_tiles as tiles
from ..after_import import when_imported

_COST_MODEL = "neuron_lab.telemetry.cost_model"


def _cm():
    """The cost model module (imported on use: telemetry is a layer the library loads late)."""
    import importlib
    return importlib.import_module(_COST_MODEL)


def _size(dtype) -> int:
    return torch.empty((), dtype=dtype, device="meta").element_size()


def _nb(t) -> int:
    return t.numel() * _size(t.dtype) if isinstance(t, torch.Tensor) else 0


def _values(t):
    """A small index tensor's values, or None where they cannot be read (meta, tracing)."""
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return None
    try:
        return t.tolist()
    except Exception:
        return None


def _bind(op, args, kwargs) -> dict:
    names = [a.name for a in op._schema.arguments]
    bound = dict(zip(names, args))
    bound.update(kwargs or {})
    return bound


# --- FlashAttention -----------------------------------------------------------------------------

def _segments(a: dict):
    t, s = a["q"].shape[2], a["k"].shape[2]
    cq, ck = _values(a.get("cu_seqlens_q")), _values(a.get("cu_seqlens_k"))
    if cq is None or ck is None:
        return [(t, s)]
    return [(cq[i + 1] - cq[i], ck[i + 1] - ck[i]) for i in range(len(cq) - 1)]


def _attention_work(a: dict):
    """(visible tiles, visible entries) summed over segments."""
    causal, window = bool(a.get("causal", False)), int(a.get("window", -1))
    bq, bk = int(a.get("block_q", 128)), int(a.get("block_k", 128))
    tiles_n = entries = 0
    for t, s in _segments(a):
        n, e = tiles.tile_counts(t, s, tiles.Mask(causal, window, s - t), bq, bk)
        tiles_n, entries = tiles_n + n, entries + e
    return tiles_n, entries, bq, bk


def flash_forward_cost(a: dict) -> tuple[int, float]:
    q, k, v = a["q"], a["k"], a["v"]
    b, h, t, d = q.shape
    hkv, dv, item = k.shape[1], v.shape[-1], _size(q.dtype)
    n_tiles, entries, _bq, bk = _attention_work(a)
    kv_tile = b * hkv * min(bk, k.shape[2]) * (d + dv) * item
    moved = _nb(q) + b * h * t * dv * item + b * h * t * 4 + n_tiles * kv_tile
    return moved, 4.0 * b * h * entries * d


def flash_backward_cost(a: dict) -> tuple[int, float]:
    q, k, v = a["q"], a["k"], a["v"]
    b, h, t, d = q.shape
    hkv, dv, item = k.shape[1], v.shape[-1], _size(q.dtype)
    n_tiles, entries, bq, _bk = _attention_work(a)
    rows = min(bq, t)
    q_tile = b * h * rows * (d * item + dv * item + 8 + d * 8)   # q, dO, lse, D, dQ (f32 r+w)
    delta = 2 * b * h * t * dv * item + b * h * t * 4            # D = rowsum(dO∘O)
    kv = 2 * (_nb(k) + _nb(v))                                   # read k, v; write dk, dv
    moved = delta + kv + n_tiles * q_tile + _nb(q)               # + dq written
    return moved, 10.0 * b * h * entries * d


# --- MoE ----------------------------------------------------------------------------------------

def route_cost(a: dict) -> tuple[int, float]:
    logits, k = a["logits"], int(a["top_k"])
    n, e = logits.shape
    return _nb(logits) + n * k * (4 + 8), 5.0 * n * e


def route_bwd_cost(a: dict) -> tuple[int, float]:
    logits = a["logits"]
    n, e = logits.shape
    return 2 * _nb(logits) + _nb(a["grad"]) + _nb(a["ids"]), 8.0 * n * e


def permute_cost(a: dict) -> tuple[int, float]:
    hidden, ids = a["hidden"], a["expert_ids"]
    m = ids.numel()
    row = hidden.shape[-1] * _size(hidden.dtype)
    return _nb(ids) + 2 * m * row + m * 8 + int(a.get("num_experts", 0)) * 20, float(m)


def permute_bwd_cost(a: dict) -> tuple[int, float]:
    g = a["grad_rows"]
    return 2 * _nb(g) + _nb(a["perm"]), float(g.numel())


def _kept_rows(offsets, m: int) -> tuple[int, int | None]:
    vals = _values(offsets)
    if not vals:
        return m, None
    active = sum(1 for i, end in enumerate(vals) if end > (vals[i - 1] if i else 0))
    return int(vals[-1]), active


def _gemm_terms(a: dict) -> tuple[int, int, int, int, int]:
    """(rows kept, k, n, activation item size, bytes of the weights of the experts used) of a
    grouped GEMM's arguments."""
    x, w = a["x"], a["w"]
    m, kdim = x.shape
    e, n, _ = w.shape
    kept, active = _kept_rows(a["offsets"], m)
    weights = (active if active is not None else e) * n * kdim * _size(w.dtype)
    return kept, kdim, n, _size(x.dtype), weights


def gemm_cost(a: dict) -> tuple[int, float]:
    kept, kdim, n, item, weights = _gemm_terms(a)
    return kept * kdim * item + weights + kept * n * item, 2.0 * kept * n * kdim


def gemm_bwd_cost(a: dict) -> tuple[int, float]:
    kept, kdim, n, item, weights = _gemm_terms(a)      # reads the weights, writes their grad
    return 2 * kept * (kdim + n) * item + 2 * weights, 4.0 * kept * n * kdim


def unpermute_cost(a: dict) -> tuple[int, float]:
    rows, weights = a["rows"], a["weights"]
    kept, _ = _kept_rows(a["offsets"], rows.shape[0])
    row = rows.shape[-1] * _size(rows.dtype)
    return kept * (row + 8 + 4) + weights.shape[0] * row, 2.0 * kept * rows.shape[-1]


def unpermute_bwd_cost(a: dict) -> tuple[int, float]:
    rows = a["rows"]
    kept, _ = _kept_rows(a["offsets"], rows.shape[0])
    row = rows.shape[-1] * _size(rows.dtype)
    return kept * 3 * row + _nb(a["weights"]) * 2 + _nb(a["grad"]), 4.0 * kept * rows.shape[-1]


@functools.cache
def _ops() -> dict:
    o = torch.ops.neuron_lab
    return {o.flash_attention_fwd: flash_forward_cost, o.flash_attention_bwd: flash_backward_cost,
            o.moe_route: route_cost, o.moe_route_bwd: route_bwd_cost,
            o.moe_permute: permute_cost, o.moe_permute_bwd: permute_bwd_cost,
            o.grouped_gemm: gemm_cost, o.grouped_gemm_bwd: gemm_bwd_cost,
            o.moe_unpermute: unpermute_cost, o.moe_unpermute_bwd: unpermute_bwd_cost}


def _dtype_of(a: dict) -> str:
    t = next((x for x in a.values() if isinstance(x, torch.Tensor) and x.is_floating_point()),
             None)
    return str(t.dtype if t is not None else torch.float32).removeprefix("torch.")


def kernel_cost(packet, args, kwargs):
    """The ``Cost`` of one call of a library kernel (the cost model's hook calls this)."""
    a = _bind(packet.default, args, kwargs)
    moved, flops = _ops()[packet](a)
    return _cm().Cost(int(moved), float(flops), _dtype_of(a))


def _hook_bytes(cost_model_module) -> None:
    hook = getattr(cost_model_module, "KERNEL_COSTS", None)      # the cost model's byte hook
    if hook is not None:
        for packet in _ops():
            hook[packet] = lambda args, kwargs, out, _p=packet: kernel_cost(_p, args, kwargs)


def _register() -> None:
    for packet, fn in _ops().items():
        if packet not in flop_registry:
            def formula(*args, out_val=None, _p=packet, _fn=fn, **kwargs):
                return _fn(_bind(_p.default, args, kwargs))[1]
            register_flop_formula(packet, get_raw=True)(formula)
    when_imported(_COST_MODEL, _hook_bytes)


# --- FlashAttention against the unfused path ----------------------------------------------------

def _launches_s(model, launches) -> float:
    return sum(model.launch_s(c) for c in launches)


def unfused_attention(batch: int, heads: int, t: int, d: int, dtype=torch.bfloat16,
                      kv_heads: int | None = None, s: int | None = None, causal: bool = True,
                      backward: bool = False) -> list:
    """The launches of ``sdpa``'s math path (matmul, scale, mask, softmax, matmul; GQA keys
    expanded first), each through HBM, as ``Cost`` rows; with ``backward``, its backward too."""
    s = t if s is None else s
    kv_heads = heads if kv_heads is None else kv_heads
    item, dt = _size(dtype), str(dtype).removeprefix("torch.")
    q = batch * heads * t * d * item
    kv = batch * heads * s * d * item
    scores = batch * heads * t * s * item
    mm = 2.0 * batch * heads * t * s * d
    out = [] if kv_heads == heads else [_cm().Cost(2 * kv * kv_heads // heads + 2 * kv, 0.0, dt)]
    out += [_cm().Cost(q + kv + scores, mm, dt),                       # q @ kᵀ
            _cm().Cost(2 * scores, batch * heads * t * s, dt)]         # * scale
    if causal:
        out.append(_cm().Cost(2 * scores + t * s, batch * heads * t * s, dt))   # masked_fill
    out += [_cm().Cost(2 * scores, 5.0 * batch * heads * t * s, dt),   # softmax
            _cm().Cost(scores + kv + q, mm, dt)]                       # p @ v
    if backward:
        out += [_cm().Cost(q + kv + scores, mm, dt),                   # dP = dO vᵀ
                _cm().Cost(scores + q + kv, mm, dt),                   # dV = Pᵀ dO
                _cm().Cost(3 * scores, 4.0 * batch * heads * t * s, dt),   # softmax backward
                _cm().Cost(2 * scores, batch * heads * t * s, dt),     # * scale
                _cm().Cost(scores + kv + q, mm, dt),                   # dQ = dS k
                _cm().Cost(scores + q + kv, mm, dt)]                   # dK = dSᵀ q
    return out


def flash_attention_launches(batch: int, heads: int, t: int, d: int, dtype=torch.bfloat16,
                             kv_heads: int | None = None, s: int | None = None,
                             causal: bool = True, window: int | None = None,
                             backward: bool = False) -> list:
    """The kernel's launches (one forward, one backward) as ``Cost`` rows."""
    from .flash_attention import BLOCK_K, BLOCK_Q
    s = t if s is None else s
    kv_heads = heads if kv_heads is None else kv_heads
    meta = lambda *shape: torch.empty(shape, dtype=dtype, device="meta")  # noqa: E731
    a = {"q": meta(batch, heads, t, d), "k": meta(batch, kv_heads, s, d),
         "v": meta(batch, kv_heads, s, d), "causal": causal,
         "window": -1 if window is None else window, "block_q": BLOCK_Q, "block_k": BLOCK_K}
    dt = str(dtype).removeprefix("torch.")
    out = [_cm().Cost(*flash_forward_cost(a), dt)]
    if backward:
        out.append(_cm().Cost(*flash_backward_cost(a), dt))
    return out


def compare_attention(batch: int, heads: int, t: int, d: int, dtype=torch.bfloat16,
                      chip: str = "trn2", **kw) -> dict:
    """Modelled HBM bytes, FLOPs, launches and seconds on ``chip``: FlashAttention against the
    unfused math path, forward and backward. A model, not a measurement."""
    model = _cm().cost_model(chip)
    rows = {}
    for name, fn in (("flash", flash_attention_launches), ("unfused", unfused_attention)):
        launches = fn(batch, heads, t, d, dtype, backward=True, **kw)
        rows[name] = {"launches": len(launches), "bytes": sum(c.bytes for c in launches),
                      "flops": sum(c.flops for c in launches),
                      "modelled_s": _launches_s(model, launches)}
    rows["chip"] = chip
    rows["hbm_ratio"] = rows["unfused"]["bytes"] / max(rows["flash"]["bytes"], 1)
    rows["speedup"] = rows["unfused"]["modelled_s"] / max(rows["flash"]["modelled_s"], 1e-30)
    return rows

