"""Modelled device time of recorded launches: the cost model applied to what the runtime ran.

A region (``runtime.cache.Region``) knows, for each of its ops, the op, the argument keys (an
external input is ``("x", shape, stride, offset, dtype)``, a value made inside the region is
``("r", distance_back, output_index)``) and the output metadata. That is enough to price it
without touching data: ``region_cost`` gives the cost of each op as a launch of its own and the
cost of the region as one fused launch (inputs from outside, outputs nothing inside consumes).
It is computed once per region and cached by id.

``modelled_launches(launches)`` prices a list of ``launch`` events (the store keeps them). A
launch of a recognised region is one fused launch on the chip whatever the host did with it
(the host may run it per-op while its program compiles, or because the host's fused program
was not faster: a CPU matter), as in ``estimate``'s steady state; ``as_run=True`` prices a
host ``per-op`` launch as one launch per op instead.
Ops the runtime ran outside a recorded region (a region's first run, eager mode) have no launch
event; ``covered_ops`` says how many ops the figure covers. ``estimate()`` (estimate.py) sees
every op and so covers eager mode too.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import runtime
from ..compile.flex_attention import modelled_cost as _kernel_cost   # block-sparse kernels
from ..device import tracking
from .cost_model import Cost, CostModel, _dtype_name, nbytes, op_flops


class RegionCost(NamedTuple):
    per_op: tuple          # Cost of each op run as its own launch
    fused: Cost            # the region as one fused launch


_cache: dict[int, RegionCost] = {}


def _meta(shape, dtype):
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


def _args(key, i: int, metas, ext: list, internal: list, consumed: set):
    """Rebuild an argument from its key (tensors as meta tensors), noting tensor reads."""
    if type(key) is tuple:
        if len(key) == 5 and key[0] == "x" and isinstance(key[4], torch.dtype):
            ext.append(nbytes(key[1], key[4]))
            return _meta(key[1], key[4])
        if len(key) == 3 and key[0] == "r" and type(key[1]) is int:
            j, k = i - key[1], key[2]
            m = metas[j][k] if 0 <= j < len(metas) and k < len(metas[j]) else None
            if m is None:
                return None
            consumed.add((j, k))
            internal.append(nbytes(m[0], m[3]))
            return _meta(m[0], m[3])
        if len(key) == 2 and type(key[0]) is type and key[0] in (int, float, bool):
            return key[1]
        if key == ("float",):
            return 1.0
        if len(key) == 2 and key[0] == "ints" and type(key[1]) is tuple:
            return list(key[1])
        return [_args(k, i, metas, ext, internal, consumed) for k in key]
    return key


def region_cost(region) -> RegionCost:
    hit = _cache.get(region.id)
    if hit is not None:
        return hit
    per_op, consumed, ext_total, flops_total = [], set(), 0, 0.0
    dtypes: list = []
    for i, (op, argkeys) in enumerate(region.keys):
        op = getattr(op, "op", op)          # keys name the op by its OpFacts
        ext, internal = [], []
        names = {a.name for a in getattr(op, "_schema", None).arguments} \
            if hasattr(op, "_schema") else set()
        args, kwargs = [], {}
        for k in argkeys:
            if type(k) is tuple and len(k) == 2 and type(k[0]) is str and k[0] in names:
                kwargs[k[0]] = _args(k[1], i, region.metas, ext, internal, consumed)
            else:
                args.append(_args(k, i, region.metas, ext, internal, consumed))
        outs = [_meta(m[0], m[3]) for m in region.metas[i] if m is not None]
        out_bytes = sum(nbytes(m[0], m[3]) for m in region.metas[i] if m is not None)
        kernel = _kernel_cost(op, args, kwargs, outs)    # a block-sparse kernel's own figures
        try:
            flops = kernel[1] if kernel else op_flops(op, args, kwargs, outs)
        except Exception:
            flops = float(sum(o.numel() for o in outs))
        dt = next((m[3] for m in region.metas[i] if m is not None and m[3].is_floating_point),
                  torch.float32)
        dtypes.append(dt)
        moved = kernel[0] if kernel else sum(ext) + sum(internal) + out_bytes
        per_op.append(Cost(moved, flops, _dtype_name(dt)))
        ext_total += sum(ext)
        flops_total += flops
    written = sum(nbytes(m[0], m[3]) for i, ms in enumerate(region.metas)
                  for k, m in enumerate(ms) if m is not None and (i, k) not in consumed)
    low = min(dtypes, key=lambda d: torch.finfo(d).bits, default=torch.float32)
    cost = RegionCost(tuple(per_op), Cost(ext_total + written, flops_total, _dtype_name(low)))
    _cache[region.id] = cost
    return cost


def _regions_by_id() -> dict:
    return {r.id: r for r in runtime.current().regions()}


class Modelled(NamedTuple):
    modelled_s: float
    launches: int          # modelled launches: a per-op batch of n ops is n launches
    covered_ops: int
    bytes: int
    flops: float


def modelled_launches(launches, model: CostModel, as_run: bool = False) -> Modelled:
    """Price ``launch`` events ({region, ops, kind}) with ``model``."""
    regions = None
    s = n = ops = moved = 0
    flops = 0.0
    for ev in launches:
        rid = ev.get("region", -1)
        if regions is None:
            regions = _regions_by_id()
        region = regions.get(rid)
        if region is None:
            continue                      # evicted since, or a lone batch: not priced
        rc = region_cost(region)
        costs = rc.per_op if as_run and ev.get("kind") != "fused" else (rc.fused,)
        for c in costs:
            s += model.launch_s(c)
            moved += c.bytes
            flops += c.flops
        n += len(costs)
        ops += region.ops
    return Modelled(s, n, ops, moved, flops)


def annotate(launches: list[dict], model: CostModel) -> None:
    """Add ``modelled_s``, ``bytes`` and ``flops`` (on ``model``'s chip) to launch rows in place;
    None where the region is no longer cached."""
    regions = _regions_by_id()
    for ev in launches:
        region = regions.get(ev.get("region", -1))
        if region is None:
            ev.update(modelled_s=None, bytes=None, flops=None)
            continue
        c = region_cost(region).fused
        ev.update(modelled_s=model.launch_s(c), bytes=c.bytes, flops=c.flops)


def region_rows(model: CostModel) -> list[dict]:
    """Every cached region with its modelled costs: the ``regions`` export table."""
    rows = []
    for r in runtime.current().regions():
        rc = region_cost(r)
        s = r.summary()
        s["first_ops"] = list(r.names)
        s["location"] = tracking.format_location(r.where)[0]
        s.update(per_op_modelled_s=sum(model.launch_s(c) for c in rc.per_op),
                 fused_modelled_s=model.launch_s(rc.fused), fused_bytes=rc.fused.bytes,
                 per_op_bytes=sum(c.bytes for c in rc.per_op), flops=rc.fused.flops)
        rows.append(s)
    return rows


def clear() -> None:
    _cache.clear()
