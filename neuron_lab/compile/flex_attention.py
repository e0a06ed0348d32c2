"""FlexAttention on ``neuron``: the device's kernels, in eager, adaptive and compiled mode.

PyTorch's FlexAttention is two higher-order ops, ``flex_attention`` and
``flex_attention_backward``, whose kernels are chosen per device: eager runs the dense math
reference (``sdpa_dense``), inductor generates Triton (GPU) or C++ (CPU, inference only — torch
2.13's CPU has no FlexAttention backward, eager or compiled). The device provides its own pair
of kernels (``flex_kernel``: block-sparse forward, exact backward), as a chip backend does:

- two device kernels (``neuron_lab::flex_fwd``, ``neuron_lab::flex_bwd``, made with
  ``device.custom_kernels.kernel``): their bodies run on the host buffers; on ``neuron`` they
  go through the device's generic kernel like any op (memory accounted; in adaptive mode a
  queued, opaque op of a region);
- **eager / adaptive**: both HOPs get a ``PrivateUse1`` implementation that calls them
  (PyTorch's own autograd implementation of the HOP stays: it calls the forward HOP below
  autograd and the backward HOP from ``backward()``, both land here);
- **compiled**: ``replace_hops`` (called by ``backend._inner_compile`` on every ``neuron``
  graph, before it moves to the host) turns each HOP node of the post-grad graph into a call of
  the same kernels, which inductor runs as extern kernels between its fused code.

``score_mod`` and ``mask_mod`` are graphs, not tensors, so a kernel call names them by an
integer: a fingerprint of their code and constants (``register_mods``), stable across
processes so inductor's FX graph cache stays valid (the pass registers them again before a
cached program runs). Each call records the blocks it computed (``stats()``); the cost model
prices the kernels from those blocks (``modelled_flops``, called by ``telemetry/costing``).
"""
from __future__ import annotations

import hashlib
import threading
from typing import Callable

import torch
from torch import Tensor

from ..device.custom_kernels import kernel
from . import flex_kernel

_mods: dict[int, tuple[Callable, Callable | None]] = {}
_lock = threading.Lock()
_stats = {"launches": 0, "backward_launches": 0, "blocks_computed": 0, "blocks_needed": 0,
          "blocks_total": 0, "last": None}
# blocks computed / dense grid of the last launch with these shapes and mods (cost model)
_fraction: dict[tuple, float] = {}
# The dispatch state of plain Python code. A kernel body may be entered with most keys
# excluded (an extern call in a compiled program runs below autograd, with functorch's keys
# off): the kernel needs vmap (score_mod, mask_mod) and autograd (its backward's vjp).
_PLAIN_TLS = (torch._C._dispatch_tls_local_include_set(),
              torch._C._dispatch_tls_local_exclude_set())


def _plain_dispatch():
    return torch._C._ForceDispatchKeyGuard(*_PLAIN_TLS)


# --- score_mod / mask_mod by number -----------------------------------------------------------

def _fingerprint(fn) -> int:
    if isinstance(fn, torch.fx.GraphModule):
        h = hashlib.sha1(fn.code.encode())
        for name, t in sorted(_tensor_attrs(fn).items()):
            h.update(name.encode())
            h.update(repr((tuple(t.shape), t.dtype)).encode())
            h.update(_host(t).detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
                     if t.numel() else b"")
        return int.from_bytes(h.digest()[:7], "little")
    return id(fn)            # a plain function (eager debug mode): itself, kept alive below


def _tensor_attrs(gm: torch.fx.GraphModule) -> dict:
    out = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            obj = gm
            for p in node.target.split("."):
                obj = getattr(obj, p, None)
            if isinstance(obj, Tensor):
                out[node.target] = obj
    return out


def _host(t: Tensor) -> Tensor:
    if t.device.type == "neuron":
        from ..device import tensor_data
        return tensor_data.host(t)
    return t


def _host_mod(mod):
    """``mod`` with its ``device=neuron`` arguments and constants on the host (a graph traced
    on ``neuron`` tensors, e.g. ``noop_mask``'s ``new_ones(device=b.device)``), once."""
    if isinstance(mod, torch.fx.GraphModule) and not getattr(mod, "_neuron_lab_host", False):
        from . import hostgraph
        hostgraph.rewrite_devices(mod)
        mod._neuron_lab_host = True
    return mod


def register_mods(score_mod: Callable, mask_mod: Callable | None) -> int:
    """The number kernel calls use for this (score_mod, mask_mod) pair."""
    key = (_fingerprint(score_mod) * 1_000_003 + (_fingerprint(mask_mod) if mask_mod else 0)) \
        % (1 << 62)
    with _lock:
        _mods.setdefault(key, (score_mod, mask_mod))
    return key


def _lookup(mods: int):
    try:
        return _mods[mods]
    except KeyError:
        raise RuntimeError(
            f"neuron_lab::flex_fwd/flex_bwd on neuron: score_mod/mask_mod #{mods} is not "
            "registered in this process (a program compiled elsewhere, called without its "
            "compile step). Fix: call the function through torch.compile in this process, or "
            "clear the inductor cache (NEURON_LAB_CACHE_DIR).") from None


# --- the kernels ------------------------------------------------------------------------------

def _blocks(kv_num, kv_idx, full_num, full_idx, q_bs, kv_bs) -> flex_kernel.Blocks:
    return flex_kernel.Blocks(kv_num, kv_idx, full_num, full_idx, int(q_bs), int(kv_bs))


def _strided_like(x: Tensor, like_strides) -> Tensor:
    from torch._higher_order_ops.flex_attention import _permute_strides
    return _permute_strides(x.contiguous(), like_strides)


def _record(q: Tensor, kv_num: Tensor, mods: int, backward: bool) -> None:
    launch = flex_kernel.last_launch()
    if launch is None:
        return
    with _lock:
        _stats["launches" if not backward else "backward_launches"] += 1
        if not backward:
            _stats["blocks_computed"] += launch.computed
            _stats["blocks_needed"] += launch.needed
            _stats["blocks_total"] += launch.total
            _stats["last"] = launch._asdict()
            _fraction[(tuple(q.shape), tuple(kv_num.shape), mods)] = \
                launch.computed / max(launch.total, 1)


@kernel("neuron_lab::flex_fwd", mutates_args=())
def flex_fwd(q: Tensor, k: Tensor, v: Tensor, kv_num: Tensor, kv_idx: Tensor,
             full_num: Tensor | None, full_idx: Tensor | None, q_bs: int, kv_bs: int,
             scale: float, mods: int, score_bufs: list[Tensor],
             mask_bufs: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """FlexAttention forward on host buffers: (out, lse/ln2, max/ln2), block-sparse."""
    score_mod, mask_mod = _lookup(mods)
    bl = _blocks(kv_num, kv_idx, full_num, full_idx, q_bs, kv_bs)
    with _plain_dispatch(), torch.no_grad():
        out, lse, mx = flex_kernel.forward(q, k, v, bl, score_mod, mask_mod, scale,
                                           score_bufs, mask_bufs)
    _record(q, kv_num, mods, backward=False)
    return _strided_like(out, q.stride()), lse.contiguous(), mx.contiguous()


@flex_fwd.register_fake
def _(q, k, v, kv_num, kv_idx, full_num, full_idx, q_bs, kv_bs, scale, mods, score_bufs,
      mask_bufs):
    B, H, L, _ = q.shape
    out = _strided_like(q.new_empty((B, H, L, v.shape[-1])), q.stride())
    return (out, q.new_empty((B, H, L), dtype=torch.float32),
            q.new_empty((B, H, L), dtype=torch.float32))


@kernel("neuron_lab::flex_bwd", mutates_args=())
def flex_bwd(q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor | None,
             grad_lse: Tensor | None, kv_num: Tensor, kv_idx: Tensor, full_num: Tensor | None,
             full_idx: Tensor | None, q_bs: int, kv_bs: int, scale: float, mods: int,
             score_bufs: list[Tensor], mask_bufs: list[Tensor],
             buf_grad: list[bool]) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    """FlexAttention backward on host buffers: grads of q, k, v and of the score buffers
    flagged in ``buf_grad`` (in that order), from the recomputed forward."""
    score_mod, mask_mod = _lookup(mods)
    bl = _blocks(kv_num, kv_idx, full_num, full_idx, q_bs, kv_bs)
    with _plain_dispatch():
        gq, gk, gv, gb = flex_kernel.backward(q, k, v, grad_out, grad_lse, bl, score_mod,
                                              mask_mod, scale, score_bufs, mask_bufs,
                                              tuple(buf_grad))
    with _lock:
        _stats["backward_launches"] += 1
    return (_strided_like(gq.to(q.dtype), q.stride()), _strided_like(gk.to(k.dtype), k.stride()),
            _strided_like(gv.to(v.dtype), v.stride()), [g.contiguous() for g in gb])


@flex_bwd.register_fake
def _(q, k, v, grad_out, grad_lse, kv_num, kv_idx, full_num, full_idx, q_bs, kv_bs, scale,
      mods, score_bufs, mask_bufs, buf_grad):
    gb = [torch.empty_like(b, memory_format=torch.contiguous_format)
          for b, g in zip(score_bufs, buf_grad) if g]
    return (_strided_like(torch.empty_like(q), q.stride()),
            _strided_like(torch.empty_like(k), k.stride()),
            _strided_like(torch.empty_like(v), v.stride()), gb)


# --- the HOPs' PrivateUse1 implementations (eager and adaptive) -------------------------------

def _mask_parts(block_mask: tuple):
    """kv_num, kv_idx, full_num, full_idx, q_bs, kv_bs, mask_mod from ``BlockMask.as_tuple()``."""
    return (block_mask[2], block_mask[3], block_mask[4], block_mask[5], block_mask[-3],
            block_mask[-2], block_mask[-1])


def _tensors(bufs, what: str, like: Tensor) -> list:
    """The captured values as tensors: an int/float/bool (a decoding offset, a length) becomes a
    0-d tensor on ``like``'s device, which the mod's ops take as they take the number."""
    out = []
    for b in bufs:
        if isinstance(b, Tensor):
            out.append(b)
        elif isinstance(b, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
            out.append(torch.scalar_tensor(b, dtype=_scalar_dtype(b), device=like.device))
        else:
            raise NotImplementedError(
                f"FlexAttention on neuron: a {what} captures a {type(b).__name__}; the device "
                "kernel takes tensors and numbers. Fix: make it a constant of the function or "
                "a tensor.")
    return out


def _scalar_dtype(b) -> torch.dtype:
    if isinstance(b, (bool, torch.SymBool)):
        return torch.bool
    return torch.int64 if isinstance(b, (int, torch.SymInt)) else torch.float32


def _hop_forward(query, key, value, score_mod, block_mask, scale, kernel_options,
                 score_mod_other_buffers=(), mask_mod_other_buffers=()):
    kv_num, kv_idx, full_num, full_idx, q_bs, kv_bs, mask_mod = _mask_parts(block_mask)
    mods = register_mods(_host_mod(score_mod), _host_mod(mask_mod))
    return tuple(torch.ops.neuron_lab.flex_fwd(
        query, key, value, kv_num, kv_idx, full_num, full_idx, q_bs, kv_bs, scale, mods,
        _tensors(score_mod_other_buffers, "score_mod", query),
        _tensors(mask_mod_other_buffers, "mask_mod", query)))


def _hop_backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph,
                  joint_graph, block_mask, scale, kernel_options, score_mod_other_buffers=(),
                  mask_mod_other_buffers=()):
    kv_num, kv_idx, full_num, full_idx, q_bs, kv_bs, mask_mod = _mask_parts(block_mask)
    mods = register_mods(_host_mod(fw_graph), _host_mod(mask_mod))
    flags = [isinstance(b, Tensor) and b.requires_grad for b in score_mod_other_buffers]
    gq, gk, gv, gb = torch.ops.neuron_lab.flex_bwd(
        query, key, value, grad_out, grad_logsumexp, kv_num, kv_idx, full_num, full_idx,
        q_bs, kv_bs, scale, mods, _tensors(score_mod_other_buffers, "score_mod", query),
        _tensors(mask_mod_other_buffers, "mask_mod", query), flags)
    it = iter(gb)
    return gq, gk, gv, tuple(next(it) if f else None for f in flags)


_installed = [False]


def install() -> None:
    """Register the HOPs' ``PrivateUse1`` kernels (once; when FlexAttention is imported)."""
    if _installed[0]:
        return
    from torch._C import DispatchKey
    from torch._higher_order_ops.flex_attention import flex_attention as fwd_hop
    from torch._higher_order_ops.flex_attention import flex_attention_backward as bwd_hop
    fwd_hop.py_impl(DispatchKey.PrivateUse1)(_hop_forward)
    bwd_hop.py_impl(DispatchKey.PrivateUse1)(_hop_backward)
    _installed[0] = True


# --- compiled graphs --------------------------------------------------------------------------

def _attr(gm: torch.fx.GraphModule, node):
    obj = gm
    for p in node.target.split("."):
        obj = getattr(obj, p)
    return obj




def _graph_tensors(g: torch.fx.Graph, bufs: list, before) -> list:
    """Buffer arguments of a HOP node as tensor nodes (a SymInt/int becomes ``scalar_tensor``)."""
    out = []
    for b in bufs:
        v = b.meta.get("val") if isinstance(b, torch.fx.Node) else b
        if isinstance(v, Tensor):
            out.append(b)
            continue
        with g.inserting_before(before):
            out.append(g.call_function(torch.ops.aten.scalar_tensor.default, (b,),
                                       {"dtype": _scalar_dtype(v)}))
    return out


def replace_hops(gm: torch.fx.GraphModule) -> int:
    """Replace each ``flex_attention`` / ``flex_attention_backward`` node of a post-grad graph
    on ``neuron`` by the device's kernel; returns how many were replaced."""
    from torch._higher_order_ops.flex_attention import flex_attention as fwd_hop
    from torch._higher_order_ops.flex_attention import flex_attention_backward as bwd_hop
    g = gm.graph
    n = 0
    for node in list(g.nodes):
        if node.op != "call_function" or node.target not in (fwd_hop, bwd_hop):
            continue
        if node.target is fwd_hop:
            q, k, v, score_node, bm, scale, _opts, *rest = node.args
            sbufs, mbufs = (list(rest[0]) if rest else []), (list(rest[1]) if len(rest) > 1 else [])
            sbufs, mbufs = _graph_tensors(g, sbufs, node), _graph_tensors(g, mbufs, node)
            kv_num, kv_idx, full_num, full_idx, q_bs, kv_bs, mask_node = _mask_parts(bm)
            mods = register_mods(_host_mod(_attr(gm, score_node)), _host_mod(_attr(gm, mask_node)))
            with g.inserting_before(node):
                new = g.call_function(torch.ops.neuron_lab.flex_fwd.default, (
                    q, k, v, kv_num, kv_idx, full_num, full_idx, q_bs, kv_bs, scale, mods,
                    sbufs, mbufs))
            new.meta = dict(node.meta)
            node.replace_all_uses_with(new)
        else:
            (q, k, v, _out, _lse, grad_out, grad_lse, fw_node, _joint, bm, scale, _opts,
             *rest) = node.args
            sbufs, mbufs = (list(rest[0]) if rest else []), (list(rest[1]) if len(rest) > 1 else [])
            sbufs, mbufs = _graph_tensors(g, sbufs, node), _graph_tensors(g, mbufs, node)
            kv_num, kv_idx, full_num, full_idx, q_bs, kv_bs, mask_node = _mask_parts(bm)
            mods = register_mods(_host_mod(_attr(gm, fw_node)), _host_mod(_attr(gm, mask_node)))
            val = node.meta.get("val")
            bgrads = list(val[3]) if val is not None and len(val) > 3 else [None] * len(sbufs)
            flags = [x is not None for x in bgrads]
            with g.inserting_before(node):
                new = g.call_function(torch.ops.neuron_lab.flex_bwd.default, (
                    q, k, v, grad_out, grad_lse, kv_num, kv_idx, full_num, full_idx, q_bs,
                    kv_bs, scale, mods, sbufs, mbufs, flags))
            new.meta = dict(node.meta)
            _rewire_backward(g, node, new, flags)
        g.erase_node(node)
        n += 1
    if n:
        g.eliminate_dead_code()
        gm.recompile()
    return n


def _rewire_backward(g: torch.fx.Graph, old, new, flags: list[bool]) -> None:
    """Users of the HOP's 4th output index every score buffer; the kernel returns only the
    gradients flagged: renumber."""
    import operator
    pos = {i: j for j, i in enumerate(i for i, f in enumerate(flags) if f)}
    for user in list(old.users):
        if user.op == "call_function" and user.target is operator.getitem and user.args[1] == 3:
            for u2 in list(user.users):
                if u2.op == "call_function" and u2.target is operator.getitem:
                    u2.args = (u2.args[0], pos[u2.args[1]])
    old.replace_all_uses_with(new)


# --- what ran, and what it costs --------------------------------------------------------------

def stats() -> dict:
    """Kernel launches on neuron since the last ``reset_stats()``: forward launches, backward
    launches, and the forward's block pairs — ``blocks_computed`` (gathered, padding included),
    ``blocks_needed`` (listed by the masks), ``blocks_total`` (the dense grid) — and the last
    forward launch's figures."""
    with _lock:
        return dict(_stats)


def reset_stats() -> None:
    with _lock:
        _stats.update(launches=0, backward_launches=0, blocks_computed=0, blocks_needed=0,
                      blocks_total=0, last=None)


_OPS = ("flex_fwd", "flex_bwd")


def modelled_cost(op, args, kwargs, outs) -> tuple[int, float] | None:
    """(HBM bytes, FLOPs) of a FlexAttention kernel call for the cost model (``None`` for any
    other op), scaled by the fraction of blocks the last launch with these shapes and mods
    computed —
    skipped blocks cost nothing. FLOPs: the dense 2·B·H·L·S·(E+Ev). Bytes: q and out once,
    the log-sum-exp and max, and each computed block's K and V once per query block, as a
    flash kernel streams them. The backward counts 2.5× both (recompute, dS, dQ/dK/dV)."""
    name = getattr(getattr(op, "_schema", None), "name", "")
    if not name.startswith("neuron_lab::") or name.split("::", 1)[1] not in _OPS:
        return None
    try:
        return _cost(name.endswith("bwd"), args)
    except Exception:          # noqa: BLE001 - arguments in a form we do not price
        return None


def _cost(bwd: bool, args) -> tuple[int, float]:
    q, v = args[0], args[2]
    B, H, L, E = q.shape
    S, Ev = v.shape[-2], v.shape[-1]
    kv_num, q_bs, mods = (args[5], args[9], args[12]) if bwd else (args[3], args[7], args[10])
    n_q = -(-L // max(min(int(q_bs), L), 1))
    frac = _fraction.get((tuple(q.shape), tuple(getattr(kv_num, "shape", ())), mods), 1.0)
    size = q.element_size()
    flops = 2.0 * B * H * L * S * (E + Ev) * frac
    moved = size * B * H * L * (E + Ev) + 8 * B * H * L + frac * n_q * size * B * H * S * (E + Ev)
    k = 2.5 if bwd else 1.0
    return int(moved * k), flops * k
