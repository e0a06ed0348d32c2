"""``Recording``: everything the advisor's rules read, as plain rows.

``advise()`` builds one from what this process recorded (``live_recording``: the store, the op
tracking, the region cache, the memory counters); ``analyze`` builds one from a trace file
(``trace_file.read_recording``), so the rules in ``advise.py`` run the same on both and an
external tool can redo them from the file alone. The rows are the export tables' rows
(docs/telemetry.md, "Export schema").
"""
from __future__ import annotations

from typing import NamedTuple

from ..device import memory, tracking
from ..runtime import knobs
from .costing import annotate, region_rows
from .store import store


class Recording(NamedTuple):
    chip: str                 # the modelled chip the costs are priced on
    syncs: list               # [{reason, location, source, count}], most frequent first
    boundaries: list          # [{reason, location, source, count, ops}]
    fallbacks: list           # [{op, reason, count, locations: [...], source: {loc: text}}]
    regions: list             # [{id, ops, status, error, per_op_launches, fused_launches,
                              #   op_names, location, per_op_modelled_s, fused_modelled_s,
                              #   compile_s}]
    cells: list               # per-cell records ({execution_count, cell_id, wall_s, device_s,
                              #   modelled_s, peak_bytes, ...})
    launches: list            # [{t (end, Unix s), seconds (host), modelled_s (None: unpriced)}]
    capacity: int             # modelled HBM bytes
    peak_bytes: int           # the device memory peak
    ooms: int                 # allocations refused for capacity
    min_region_ops: int       # NEURON_LAB_MIN_REGION_OPS when recorded
    compile_on: bool          # NEURON_LAB_COMPILE when recorded


def region_row(r: dict) -> dict:
    """A ``regions`` export row in the form the rules read (``op_names``: every op's name)."""
    return {"id": r["id"], "ops": r["ops"], "status": r["status"], "error": r.get("error"),
            "per_op_launches": r["per_op_launches"], "fused_launches": r["fused_launches"],
            "op_names": list(r["first_ops"]), "location": r["location"],
            "per_op_modelled_s": r["per_op_modelled_s"],
            "fused_modelled_s": r["fused_modelled_s"], "compile_s": r.get("compile_s")}


def live_recording(model) -> Recording:
    """What this process recorded so far, priced on ``model``'s chip."""
    sites = store.sites()
    with store.lock:
        cells = [dict(c) for c in store.cells]
        launches = [dict(r) for r in store.launches]
        ooms = len(store.oom)
    annotate(launches, model)
    regions = [region_row(r) for r in region_rows(model)]
    return Recording(model.chip, sites["syncs"], sites["boundaries"], tracking.fallback_ops(),
                     regions, cells, launches, memory.capacity(), memory.max_memory_allocated(),
                     ooms, knobs.MIN_REGION_OPS.get(), bool(knobs.COMPILE.get()))
