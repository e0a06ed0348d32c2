"""``estimate(fn, *args, chip=None)``: would adaptive eager help this code on Trainium?

It answers for the *steady state*, not for a cold first call. ``fn(*args)`` runs once in eager
mode, then in adaptive mode until adaptive mode has learnt it: the first adaptive call records
its ops into regions (priced as it ran: ``first_call``), later calls find them recognised. It
stops at the first call whose every op ran inside a recognised region ("formed"), at most
``max_calls`` calls. ``steady`` says what the answer stands on:

- ``"compiled"``: every region launch of the last call ran its fused program (with
  ``wait_compiles=True`` the background compiles are awaited between calls, so it gets there);
- ``"modelled"``: regions formed (or some did), but the host still ran some per-op while their
  programs compile; the cost model prices each recognised region's launch as the one fused
  launch it will become (what the chip would run);
- ``"not-reached"``: nothing was recognised in ``max_calls`` calls (ops that never queue, or a
  sequence that changes every call).

Every op is seen by a ``TorchDispatchMode`` (``OpCosts``) that notes its bytes and FLOPs as one
launch of its own; the runtime's launch events (region id, op count) say which ops ran as a
recognised region: such a launch replaces the per-op launches of the ops it covers (the last
``ops`` ops seen before it, in issue order) with the region's fused cost (costing.py).
``modelled_as_run_s`` prices only the launches that were fused on the host in that call. Host
seconds are measured on the same call and include the counting (a few microseconds per op, the
same in both modes), so compare them between modes, not with an uninstrumented run.

``fn`` runs 1 + ``calls`` times (side effects too: an optimizer steps each time).
"""
from __future__ import annotations

import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import runtime
from ..device import events
from .cost_model import Cost, cost_model, op_cost
from .costing import region_cost

STEADY_MAX_CALLS = 6       # adaptive calls at most before estimate() gives up on a steady state


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
    the given ``kinds`` are priced as one fused launch each. ``uncovered``: ops that ran as
    launches of their own (not inside a recognised region)."""
    launches: list[Cost] = []
    covered: list[bool] = []       # per launch: a recognised region's fused launch
    regions = {r.id: r for r in runtime.current().regions()}
    for entry in timeline:
        if entry[0] == "op":
            launches.append(entry[1])
            covered.append(False)
            continue
        kind, rid, n = entry
        region = regions.get(rid) if kind in kinds else None
        if region is None or n > len(launches):
            continue
        del launches[len(launches) - n:]
        del covered[len(covered) - n:]
        launches.append(region_cost(region).fused)
        covered.append(True)
    return {"launches": len(launches),
            "modelled_s": sum(model.launch_s(c) for c in launches),
            "bytes": sum(c.bytes for c in launches),
            "flops": sum(c.flops for c in launches),
            "uncovered": covered.count(False)}


def _run(fn, args, kwargs, mode: str, model) -> tuple[dict, list]:
    """One call of ``fn`` in ``mode``, synchronised, its ops and launches priced on ``model``."""
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
    row["region_launches"] = sum(1 for e in costs.timeline if e[0] in ("fused", "per-op"))
    row["modelled_as_run_s"] = price(costs.timeline, model, ("fused",))["modelled_s"]
    row["host_s"] = host
    return row, costs.timeline


def estimate(fn, *args, chip: str | None = None, wait_compiles: bool = False,
             max_calls: int = STEADY_MAX_CALLS, **kwargs) -> dict:
    """Run ``fn(*args, **kwargs)`` in eager mode once, then in adaptive mode until its steady
    state (see the module docstring); per mode: ``launches``, ``modelled_s`` (on ``chip``,
    default the process's chip), ``host_s``, ``bytes``, ``flops``, ``ops``; the adaptive row
    also says how it reached the steady state (``steady``: "compiled" | "modelled" |
    "not-reached") after ``calls`` calls, and ``first_call`` is the cold first adaptive call,
    priced as it ran. Plus ``chip``, ``speedup`` (modelled eager / modelled steady adaptive)
    and the model's parameters."""
    model = cost_model(chip)
    out = {"chip": model.chip, "model": model.describe()}
    runtime.sync("estimate")
    out["eager"], _ = _run(fn, args, kwargs, "eager", model)
    first, _ = _run(fn, args, kwargs, "adaptive", model)
    first["modelled_s"] = first["modelled_as_run_s"]     # as it ran: nothing recognised yet
    row, calls, prev = first, 1, None
    while calls < max(2, max_calls):
        if wait_compiles:
            runtime.wait_compiles()
        prev = row
        row, _ = _run(fn, args, kwargs, "adaptive", model)
        calls += 1
        formed = row["uncovered"] == 0 and row["region_launches"] > 0
        stable = row["launches"] == prev["launches"] and calls > 2
        if formed and (row["fused_launches"] == row["region_launches"] or not wait_compiles
                       or not runtime.stats().get("compiles_pending", 0)):
            break
        if stable and not formed and row["uncovered"] == prev["uncovered"]:
            break
    if row["uncovered"] == 0 and row["region_launches"] and \
            row["fused_launches"] == row["region_launches"]:
        steady = "compiled"        # every region launch ran its fused program on the host
    elif row["uncovered"] < row["ops"] or row["region_launches"]:
        steady = "modelled"        # regions formed; their fused launches priced by the model
    else:
        steady = "not-reached"
    row["steady"] = steady
    row["calls"] = calls
    row["first_call"] = first
    out["adaptive"] = row
    a = row["modelled_s"]
    out["speedup"] = out["eager"]["modelled_s"] / a if a else None
    return out
