"""``neuron_lab.profile()``: a torch.profiler session plus neuron_lab's own records, exported.

Launches and compiles appear as ``neuron::fused[region N]`` / ``neuron::per-op[...]`` /
``neuron::compile[...]`` ranges (the runtime opens ``record_function`` ranges while a profiler
is active). On exit: a Chrome trace (``trace.json``, open in Perfetto or chrome://tracing), and
the launch records and per-cell records as Parquet when ``pyarrow`` is installed (the
``parquet`` extra), else CSV.
"""
from __future__ import annotations

import contextlib
import csv
import os
import time

import torch

from .report import metrics
from .store import store


def export_table(rows: list[dict], path_base: str) -> str:
    """Write ``rows`` to ``path_base.parquet`` (pyarrow) or ``path_base.csv``; returns the path."""
    cols = sorted({k for r in rows for k in r})
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        path = path_base + ".csv"
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
        return path
    path = path_base + ".parquet"
    table = pa.table({c: [r.get(c) for r in rows] for c in cols}) if cols else pa.table({})
    pq.write_table(table, path)
    return path


class Profile:
    """Result of a ``profile()`` block: the torch profiler, paths written, summary numbers."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.prof: torch.profiler.profile | None = None
        self.trace_path = self.launches_path = self.cells_path = None
        self.launches: list[dict] = []
        self.wall_s = 0.0

    def key_averages(self):
        return self.prof.key_averages()


@contextlib.contextmanager
def profile(out_dir: str = "neuron_profile", *, path: str | None = None, trace: bool = True,
            tables: bool = True):
    """Profile the block; writes ``trace.json`` and launch/cell tables under ``out_dir``
    (``path=`` is the same directory, by keyword)."""
    from .. import runtime
    out_dir = path or out_dir
    os.makedirs(out_dir, exist_ok=True)
    result = Profile(out_dir)
    with store.lock:
        n0 = len(store.launches)
    t0 = time.time()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        try:
            yield result
        finally:
            runtime.sync("profile-end")
    result.prof = prof
    result.wall_s = time.time() - t0
    with store.lock:
        result.launches = [dict(r) for r in list(store.launches)[n0:]]
        cells = list(store.cells)
    if trace:
        result.trace_path = os.path.join(out_dir, "trace.json")
        prof.export_chrome_trace(result.trace_path)
    if tables:
        result.launches_path = export_table(result.launches, os.path.join(out_dir, "launches"))
        result.cells_path = export_table(cells, os.path.join(out_dir, "cells"))
        m = metrics()
        export_table([{"name": k, "value": v} for k, v in m["runtime"].items()
                      if isinstance(v, (int, float))], os.path.join(out_dir, "runtime"))
