"""Exporters: telemetry records to files other tools read.

- ``export_table(rows, base)``: a list of flat dicts to ``base.parquet`` when ``pyarrow`` is
  installed (the ``parquet`` extra), else ``base.csv``; ``read_table(path)`` reads either back
  (CSV values are restored to int/float/None where they parse, so both round-trip). Nested
  values (lists, dicts) are stored as JSON text: Parquet needs one type per column, and a
  ``locations`` list per row would otherwise need a schema of its own.
- ``export_chrome_trace(prof, path, memory=..., fallbacks=...)``: torch.profiler's Chrome trace
  (the runtime's ``neuron::`` launch/compile ranges are already in it) plus two tracks of our
  own: a ``neuron memory`` counter (allocated/reserved bytes from the samples) and a
  ``neuron fallback`` instant event per fallback carrying the user's ``file:line``. Timestamps
  are placed on the profiler's clock through the trace's ``baseTimeNanoseconds`` (microseconds
  since that base), which is wall-clock aligned; Perfetto and chrome://tracing open the file.
"""
from __future__ import annotations

import csv
import json
import os

MEMORY_TRACK = "neuron memory"
FALLBACK_EVENT = "neuron fallback"


def _flat(v):
    return json.dumps(v) if isinstance(v, (list, tuple, dict)) else v


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
            w.writerows({k: _flat(v) for k, v in r.items()} for r in rows)
        return path
    path = path_base + ".parquet"
    table = pa.table({c: [_flat(r.get(c)) for r in rows] for c in cols}) if cols else pa.table({})
    pq.write_table(table, path)
    return path


def _parse(s: str):
    if s == "":
        return None
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    return s


def read_table(path: str) -> list[dict]:
    """Read a file written by ``export_table`` back as a list of dicts."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        return pq.read_table(path).to_pylist()
    with open(path, newline="") as f:
        return [{k: _parse(v) for k, v in r.items()} for r in csv.DictReader(f)]


def export_chrome_trace(prof, path: str, *, memory: list[dict] = (),
                        fallbacks: list[dict] = ()) -> str:
    """torch.profiler's trace at ``path``, with memory counters and fallback markers added."""
    prof.export_chrome_trace(path)
    if not memory and not fallbacks:
        return path
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    base_ns = trace.get("baseTimeNanoseconds", 0) if isinstance(trace, dict) else 0
    pid = next((e["pid"] for e in events if "pid" in e and isinstance(e["pid"], int)),
               os.getpid())

    def ts(t: float) -> float:
        return (t * 1e9 - base_ns) / 1e3

    events.extend({"ph": "C", "name": MEMORY_TRACK, "pid": pid, "ts": ts(s["t"]),
                   "args": {"allocated": s["allocated"], "reserved": s["reserved"]}}
                  for s in memory)
    events.extend({"ph": "i", "s": "p", "name": f"{FALLBACK_EVENT}: {e['op']}", "pid": pid,
                   "tid": pid, "ts": ts(e["t"]), "cat": "neuron",
                   "args": {"op": e["op"], "reason": e.get("reason"),
                            "location": e.get("location")}}
                  for e in fallbacks)
    with open(path, "w") as f:
        json.dump(trace, f)
    return path
