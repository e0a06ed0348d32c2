"""Per-cell (or per-block) records: what one notebook cell did on the device.

``CellTracker.start(cell_id)`` snapshots the counters and resets the memory peak;
``end()`` flushes the adaptive queue (so the cell's queued work is attributed to it, and the
re-run of a cell meets a cache boundary at the same place) and returns the deltas: wall time,
device time (host seconds spent in launches), ops, launches, fused share, compiles, fallbacks,
peak memory, and the modelled time of its launches on the chip this process models
(``modelled_s``: costing.py, each launch of a recognised region as one fused launch; None when
no launch could be priced, as in eager mode, whose ops make no launch events; ``modelled_ops``:
the ops it covers).
``live()`` gives the running cell's figures for the side panel.

If that flush raises (queued work failed), the record is still written, with ``error`` set, the
tracker is idle again, and the exception is kept in ``last_error`` for the caller to re-raise:
a failing cell must never leave the tracker stuck "running".
"""
from __future__ import annotations

import time

from .. import runtime
from ..device import memory, tracking
from .cost_model import cost_model
from .costing import modelled_launches
from .store import store

def _counters() -> dict:
    rs = runtime.stats()
    c = tracking.counters()
    return {"ops": c["ops"], "fallbacks": c["fallbacks"], "syncs": c["sync_total"],
            "launches": rs["launches_per_op"] + rs["launches_fused"],
            "launches_fused": rs["launches_fused"], "ops_fused": rs["ops_fused"],
            "ops_per_op": rs["ops_per_op"], "compiles": rs["compiles_queued"],
            "launch_s": store.launch_seconds}


class CellTracker:
    def __init__(self) -> None:
        self.cell_id: str | None = None
        self.started = 0.0
        self.base: dict = {}
        self.count = 0
        self.execution_count: int | None = None
        self.cell_ids: dict[int, str] = {}   # IPython execution count -> the frontend's cell id
        self.last_error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self.cell_id is not None

    def start(self, cell_id: str | None, execution_count: int | None = None) -> None:
        """Begin a record. ``execution_count`` is IPython's ``In[N]`` of the cell: locations
        read ``Cell In[N], line M``, and ``cell_ids`` lets the panel find the cell from N."""
        self.cell_id = cell_id or f"cell-{self.count + 1}"
        self.execution_count = execution_count
        if execution_count is not None:
            self.cell_ids[execution_count] = self.cell_id
            if len(self.cell_ids) > 2000:                  # bounded: drop the oldest
                del self.cell_ids[next(iter(self.cell_ids))]
        self.started = time.time()
        memory.reset_peak_memory_stats()
        self.base = _counters()

    def _delta(self) -> dict:
        now = _counters()
        d = {k: now[k] - self.base.get(k, 0) for k in now}
        fused, per_op = d["ops_fused"], d["ops_per_op"]
        d["fused_share"] = fused / (fused + per_op) if fused + per_op else 0.0
        return d

    def live(self) -> dict:
        if not self.running:
            return {"cell_id": None, "execution_count": None, "elapsed_s": 0.0, "ops": 0, "ops_per_s": 0.0, "launches": 0,
                    "fused_share": 0.0, "compile_queue": runtime.stats()["compiles_pending"]}
        d = self._delta()
        el = time.time() - self.started
        return {"cell_id": self.cell_id, "execution_count": self.execution_count, "elapsed_s": el, "ops": d["ops"],
                "ops_per_s": d["ops"] / el if el > 0 else 0.0, "launches": d["launches"],
                "fused_share": d["fused_share"], "compile_queue": runtime.stats()["compiles_pending"]}

    def end(self, execution_count: int | None = None) -> dict | None:
        """Finish the record; ``execution_count`` (IPython's result knows it for sure)
        replaces the one given at ``start``."""
        self.last_error = None
        if not self.running:
            return None
        if execution_count is not None and execution_count != self.execution_count:
            if self.cell_ids.get(self.execution_count) == self.cell_id:
                del self.cell_ids[self.execution_count]
            self.execution_count = execution_count
            self.cell_ids[execution_count] = self.cell_id
        try:
            runtime.sync("cell-end")
        except Exception as e:
            self.last_error = e
        try:
            d = self._delta()
        finally:
            cell_id, self.cell_id = self.cell_id, None
        self.count += 1
        err = self.last_error
        with store.lock:
            launches = [ev for ev in store.launches if ev["t"] >= self.started]
        try:
            mod = modelled_launches(launches, cost_model())
        except Exception:                    # pricing must never cost the user their record
            mod = None
        rec = {"cell_id": cell_id, "execution_count": self.execution_count, "index": self.count,
               "started": self.started,
               "wall_s": time.time() - self.started, "device_s": d["launch_s"], "ops": d["ops"],
               "launches": d["launches"], "fused_share": d["fused_share"],
               "compiles": d["compiles"], "fallbacks": d["fallbacks"],
               "peak_bytes": memory.max_memory_allocated(),
               "modelled_s": mod.modelled_s if mod and mod.covered_ops else None,
               "modelled_ops": mod.covered_ops if mod else 0,
               "error": f"{type(err).__name__}: {err}" if err is not None else None}
        store.add_cell(rec)
        return rec


cells = CellTracker()
