"""``estimate(fn, *args, chip="trn2")``: would adaptive eager help this code on Trainium?

It runs ``fn(*args)`` once in eager mode and once in adaptive mode (the device is synchronised
after each run) and prices both with the cost model (cost_model.py). Every op is seen by a
``TorchDispatchMode`` (``OpCosts``) that notes its bytes and FLOPs as one launch of its own;
in adaptive mode the runtime's launch events (region id, op count) say which ops ran as a
recognised region: such a launch replaces the per-op launches of the ops it covers (the last
``ops`` ops seen before it, in issue order) with the region's fused cost (costing.py).

Two adaptive figures: ``modelled_s`` is the steady state on the chip — every launch of a
recognised region is one fused program (on the host the runtime may still run it per-op while
its program compiles in the background, or because the host's fused program was not faster,
a CPU matter); ``modelled_as_run_s`` prices only the launches that were fused in this run.
A region's first run is recorded, not recognised, so it is priced per-op in both. Host
seconds are measured on the same run and include the counting (a few microseconds per op, the
same in both modes), so compare them between modes, not with an uninstrumented run.

``fn`` runs twice (side effects too: an optimizer steps twice). For a loop, let ``fn`` run a
few iterations: adaptive mode learns a region on its first run and fuses later ones (its
compile happens in the background; ``wait_compiles=True`` waits for it before the adaptive run).
"""
from __future__ import annotations

import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import runtime
from ..device import events
from .cost_model import Cost, cost_model, op_cost
from .costing import region_cost


class OpCosts(TorchDispatchMode):
    """Notes ``Cost`` per op on a neuron tensor, and the runtime's launch events, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.timeline: list = []      # ("op", Cost) | ("fused", region_id, ops)
        self._unsub = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(t.device.type == "neuron" for t in _tensors_fast(args, kwargs, out)):
            try:
                self.timeline.append(("op", op_cost(func, args, kwargs, out)))
            except Exception:
                self.timeline.append(("op", Cost(0, 0.0)))
        return out

    def _on_event(self, kind, p) -> None:
        if kind == events.LAUNCH:
            self.timeline.append((p.get("kind"), p.get("region"), p.get("ops", 0)))

    def __enter__(self):
        self._unsub = events.subscribe(self._on_event)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._unsub()


def _tensors_fast(args, kwargs, out):
    for x in (out, args, tuple((kwargs or {}).values())):
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            for e in x:
                if isinstance(e, torch.Tensor):
                    yield e
                elif isinstance(e, (list, tuple)):
                    yield from (t for t in e if isinstance(t, torch.Tensor))


def price(timeline: list, model, kinds=("fused", "per-op")) -> dict:
    """Launches, modelled seconds, bytes and FLOPs of a recorded timeline; region launches of
    the given ``kinds`` are priced as one fused launch each."""
    launches: list[Cost] = []
    regions = {r.id: r for r in runtime.engine.cache.regions()}
    for entry in timeline:
        if entry[0] == "op":
            launches.append(entry[1])
            continue
        kind, rid, n = entry
        region = regions.get(rid) if kind in kinds else None
        if region is None or n > len(launches):
            continue
        del launches[len(launches) - n:]
        launches.append(region_cost(region).fused)
    return {"launches": len(launches),
            "modelled_s": sum(model.launch_s(c) for c in launches),
            "bytes": sum(c.bytes for c in launches),
            "flops": sum(c.flops for c in launches)}


def estimate(fn, *args, chip: str = "trn2", wait_compiles: bool = False, **kwargs) -> dict:
    """Run ``fn(*args, **kwargs)`` in eager and in adaptive mode; per mode: ``launches``,
    ``modelled_s`` (on ``chip``), ``host_s``, ``bytes``, ``flops``, ``ops``; plus ``chip``,
    ``speedup`` (modelled eager / modelled adaptive) and the model's parameters."""
    model = cost_model(chip)
    out = {"chip": chip, "model": model.describe()}
    runtime.sync("estimate")
    for mode in ("eager", "adaptive"):
        if mode == "adaptive" and wait_compiles:
            runtime.wait_compiles()
        costs = OpCosts()
        with runtime.mode(mode):
            t0 = time.perf_counter()
            with costs:
                fn(*args, **kwargs)
                runtime.sync("estimate")
            host = time.perf_counter() - t0
        row = price(costs.timeline, model)
        row["ops"] = sum(1 for e in costs.timeline if e[0] == "op")
        row["fused_launches"] = sum(1 for e in costs.timeline if e[0] == "fused")
        if mode == "adaptive":
            row["modelled_as_run_s"] = price(costs.timeline, model, ("fused",))["modelled_s"]
        row["host_s"] = host
        out[mode] = row
    a = out["adaptive"]["modelled_s"]
    out["speedup"] = out["eager"]["modelled_s"] / a if a else None
    return out
