"""``neuron_lab.advise()``: what to change, ranked by what it costs on the modelled chip.

It reads only what was recorded (the store, the op tracking, the region cache, the per-cell
records) and returns findings, each a ``Finding`` (a dict when returned): ``kind``, ``where``
(the user's line: ``Cell In[N], line M`` in a notebook, ``file.py:line`` in a script),
``message``, ``fix``, ``modelled_s`` (the modelled trn2 seconds it costs, cost_model.py) and
``count``. Ranked: memory near capacity first (a risk, not a time), then by ``modelled_s``.

Kinds and the rule that finds each (thresholds are the module constants):

- ``host-sync-in-loop``: the same line synced (``.item()``, ``.cpu()``, ``bool()``, a
  data-dependent op, ...) at least ``SYNC_LOOP_MIN`` times. Each sync drains the queue and
  waits for the device: modelled as one launch overhead of idle device per sync.
- ``fallback-hot``: an op fell back to the host at least ``FALLBACK_HOT_MIN`` times. Each call
  is modelled as two transfers and a launch (``3 × launch overhead``).
- ``region-never-fuses``: a region launched at least ``REGION_HOT_MIN`` times that will not run
  fused, and why (too short to compile, compiling off, its compile or run failed, its fused
  program was slower on the host). Cost: its launches priced per-op minus priced fused.
- ``recompiles``: one op sequence recorded as ``RECOMPILE_MIN`` or more regions (shapes or
  non-float Python values change between calls): each is recorded, and compiled, on its own.
- ``memory-near-capacity``: a peak above ``MEMORY_NEAR`` of the modelled HBM, or an OOM.
- ``host-bound``: a cell whose host time outside launches exceeds ``HOST_BOUND_RATIO`` × its
  modelled device time (and ``HOST_BOUND_MIN_S``): the chip would sit idle between launches.
  Without cell records (a script), the same test runs over the recorded launches' time span,
  located at the line where most regions ended.
"""
from __future__ import annotations

from typing import NamedTuple

from .cost_model import cost_model
from .recording import Recording, live_recording

SYNC_LOOP_MIN = 3
FALLBACK_HOT_MIN = 3
REGION_HOT_MIN = 3
RECOMPILE_MIN = 3
MEMORY_NEAR = 0.85
HOST_BOUND_RATIO = 4.0
HOST_BOUND_MIN_S = 0.05
_HOST_SYNCS = {"item", "cpu", "tolist", "bool", "numpy", "repr", "data-dependent"}


class Finding(NamedTuple):
    kind: str
    where: str
    message: str
    fix: str
    modelled_s: float
    count: int


def _syncs(model, rec: Recording) -> list[Finding]:
    out = []
    for s in rec.syncs:
        if s["reason"] not in _HOST_SYNCS or s["count"] < SYNC_LOOP_MIN:
            continue
        what = {"item": ".item()", "cpu": ".cpu()/.to('cpu')", "tolist": ".tolist()",
                "bool": "bool()/if on a tensor", "numpy": ".numpy()", "repr": "printing a tensor",
                "data-dependent": "an op with a data-dependent shape (nonzero, boolean mask)"}
        src = f" ({s['source']})" if s["source"] else ""
        out.append(Finding(
            "host-sync-in-loop", s["location"],
            f"{what[s['reason']]} ran {s['count']} times at this line{src}: each one waits for "
            f"the device and ends the fused region there.",
            "Keep the value on the device inside the loop (e.g. collect losses with "
            "loss.detach() and read them once after the loop, or every N steps); replace "
            "data-dependent ops with fixed-shape ones (torch.where instead of a boolean mask).",
            s["count"] * model.params.launch_overhead_s, s["count"]))
    return out


def _fix_for_fallback(reason: str) -> str:
    r = reason.lower()
    if "float64" in r or "complex" in r:
        return ("Trainium has no float64/complex: create or cast the tensor as float32 "
                "(dtype=torch.float32, .float(), torch.set_default_dtype(torch.float32)).")
    if "random" in r or "rng" in r:
        return "Draw random numbers once outside the hot loop, or on the host and move them once."
    return ("Use an op with a neuron kernel, or write one with neuron_lab.kernel "
            "(docs/device-contract.md).")


def _fallbacks(model, rec: Recording) -> list[Finding]:
    out = []
    for f in rec.fallbacks:
        if f["count"] < FALLBACK_HOT_MIN:
            continue
        where = f["locations"][0] if f["locations"] else "<unknown>:0"
        src = f["source"].get(where, "") if f.get("source") else ""
        out.append(Finding(
            "fallback-hot", where,
            f"{f['op']} ran on the host {f['count']} times ({f['reason']})"
            + (f": {src}" if src else "") + ". Each call copies its inputs off the device "
            "and the result back, and ends the region.",
            _fix_for_fallback(f["reason"]),
            f["count"] * 3 * model.params.launch_overhead_s, f["count"]))
    return out


def _never_fuses(r: dict, rec: Recording) -> str | None:
    """Why a region (a ``regions`` row) will not run fused, or None if it does or still may."""
    st = r["status"]
    if st == "failed":
        return f"its compile or fused run failed ({(r.get('error') or '').splitlines()[0][:160]})"
    if st == "slower":
        return "its fused program was slower than per-op on the host executor"
    if st == "recorded":
        if r["ops"] < rec.min_region_ops:
            return (f"it has {r['ops']} op{'s' if r['ops'] != 1 else ''}, fewer than "
                    f"NEURON_LAB_MIN_REGION_OPS={rec.min_region_ops}: a sync point or an "
                    f"op that cannot be queued cuts the code into regions too short to compile")
        if not rec.compile_on:
            return "compilation is off (NEURON_LAB_COMPILE=0)"
    return None


def _regions(model, rec: Recording) -> list[Finding]:
    out = []
    for r in rec.regions:
        launches = r["per_op_launches"] + r["fused_launches"]
        if launches < REGION_HOT_MIN:
            continue
        why = _never_fuses(r, rec)
        if why is None:
            continue
        names = r["op_names"]
        saving = r["per_op_modelled_s"] - r["fused_modelled_s"]
        out.append(Finding(
            "region-never-fuses", r["location"],
            f"region {r['id']} ({', '.join(names[:4])}{', ...' if r['ops'] > 4 else ''}; "
            f"{r['ops']} ops) ran {launches} times per-op and will not fuse: {why}.",
            "Move syncs (.item(), printing, .cpu()) out of the loop so the loop body forms one "
            "longer region; keep shapes and dtypes fixed from step to step.",
            launches * max(saving, 0.0), launches))
    by_names: dict = {}
    for r in rec.regions:
        by_names.setdefault(tuple(r["op_names"]), []).append(r)
    for names, group in by_names.items():
        if len(group) < RECOMPILE_MIN:
            continue
        cost = sum(r["per_op_modelled_s"] for r in group)
        compile_s = sum(r.get("compile_s") or 0.0 for r in group)
        out.append(Finding(
            "recompiles", group[-1]["location"],
            f"the op sequence {', '.join(names[:4])}{', ...' if len(names) > 4 else ''} was "
            f"recorded as {len(group)} different regions (its shapes or Python values change "
            f"from call to call): each is recorded per-op and compiled on its own"
            + (f" ({compile_s:.1f} s of host compiles)" if compile_s else "") + ".",
            "Keep shapes fixed (pad or bucket variable lengths), pass changing integers as "
            "tensors, and keep the batch size constant (drop_last=True).",
            cost, len(group)))
    return out


def _memory(rec: Recording) -> list[Finding]:
    cap, ooms, cells = rec.capacity, rec.ooms, rec.cells
    peak_cell = max(cells, key=lambda c: c.get("peak_bytes") or 0, default=None)
    peak = max(rec.peak_bytes, (peak_cell.get("peak_bytes") or 0) if peak_cell else 0)
    if not ooms and peak < MEMORY_NEAR * cap:
        return []
    where = (f"Cell In[{peak_cell['execution_count']}]"
             if peak_cell and peak_cell.get("execution_count") is not None else "<process>")
    msg = (f"peak device memory {peak / 2**30:.2f} GiB is {peak / cap:.0%} of the modelled "
           f"{cap / 2**30:.2f} GiB HBM" + (f"; {ooms} allocation(s) ran out of memory"
                                            if ooms else "") + ".")
    return [Finding("memory-near-capacity", where, msg,
                    "Free what you no longer need (del x; torch.neuron.empty_cache()), lower the "
                    "batch size, keep activations in bfloat16, or checkpoint activations "
                    "(torch.utils.checkpoint).", 0.0, ooms or 1)]


def _host_bound(rec: Recording) -> list[Finding]:
    out = []
    chip = rec.chip                   # per-cell records are priced on the process's chip
    for c in rec.cells:
        mod = c.get("modelled_s")
        if not mod:
            continue
        host = c["wall_s"] - c.get("device_s", 0.0)
        if host < HOST_BOUND_MIN_S or host < HOST_BOUND_RATIO * mod:
            continue
        n = c.get("execution_count")
        where = f"Cell In[{n}]" if n is not None else c["cell_id"]
        hot = next((s for s in rec.boundaries if n is not None
                    and s["location"].startswith(f"Cell In[{n}],")), None)
        if hot is not None:
            where = hot["location"]
        out.append(Finding(
            "host-bound", where,
            f"the host spent {host * 1e3:.0f} ms outside device launches while the modelled "
            f"{chip} time of the cell's launches is {mod * 1e3:.2f} ms: the chip would sit idle "
            f"{host / (host + mod):.0%} of the time, waiting for Python between launches.",
            _HOST_BOUND_FIX, max(host - mod, 0.0), 1))
    return out


def _host_bound_stretch(rec: Recording) -> list[Finding]:
    """Scripts: the span of the recorded launches, host time outside them vs modelled time."""
    launches = rec.launches          # [{t (end), seconds, modelled_s (None: not priced)}]
    if len(launches) < REGION_HOT_MIN:
        return []
    span = launches[-1]["t"] - launches[0]["t"]
    host = span - sum(ev.get("seconds", 0.0) for ev in launches[1:])
    priced = [ev["modelled_s"] for ev in launches[1:] if ev.get("modelled_s") is not None]
    mod = sum(priced)
    if not priced or host < HOST_BOUND_MIN_S or host < HOST_BOUND_RATIO * mod:
        return []
    where = rec.boundaries[0]["location"] if rec.boundaries else "<process>"
    return [Finding(
        "host-bound", where,
        f"over {len(launches)} launches the host spent {host * 1e3:.0f} ms outside them while "
        f"their modelled {rec.chip} time is {mod * 1e3:.2f} ms: the chip would sit idle "
        f"{host / (host + mod):.0%} of the time, waiting for Python between launches.",
        _HOST_BOUND_FIX, max(host - mod, 0.0), len(launches))]


_HOST_BOUND_FIX = ("Give the device more work per launch: batch small ops into tensor ops, "
                   "remove per-step Python work and syncs from the loop, run in adaptive mode, "
                   "or torch.compile the step.")


def findings(rec: Recording) -> list[dict]:
    """Ranked findings from a ``Recording``: what this process recorded (``advise``) or what a
    trace file holds (``analyze``), by the same rules."""
    model = cost_model(rec.chip)
    bound = _host_bound(rec) if rec.cells else _host_bound_stretch(rec)
    found = _memory(rec) + _syncs(model, rec) + _fallbacks(model, rec) + _regions(model, rec) \
        + bound
    found.sort(key=lambda f: (f.kind != "memory-near-capacity", -f.modelled_s))
    return [f._asdict() for f in found]


def advise(chip: str | None = None) -> list[dict]:
    """Ranked findings from everything recorded so far (see the module docstring)."""
    return findings(live_recording(cost_model(chip)))
