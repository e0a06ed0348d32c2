"""One self-contained trace file (``trace.parquet``): the device's launches, as torch.profiler's
device events carry them, and everything the advisor reads, so that the file alone is enough
to redo the analysis (``python -m neuron_lab analyze trace.parquet``, or any Parquet reader).

One row per record, its kind in ``event``; a column a kind does not use is null. Nested values
are JSON text (so every column has one type). Times are Unix seconds, durations seconds, sizes
bytes. The columns, by kind, are documented in docs/telemetry.md ("The trace file"):

==========  ==========================================================================
``launch``  one device launch: name, kind (op | fused | per-op), t (start), dur_s (measured
            on the host executor), modelled_s, bytes, flops, region, ops, op_names,
            location (the user's line), correlation (the launching CPU op's id in the
            torch trace), thread
``sync``    a line where the host read a device value: reason, location, source, count
``boundary``a line where a region ended: reason, location, source, count, ops
``fallback``an op that ran on the host: name (the op), reason, count, location (the most
            frequent), locations (JSON list), source (JSON: location -> line text)
``region``  a cached region: region (id), ops, status, error, per_op_launches,
            fused_launches, op_names, location, per_op_modelled_s, modelled_s (fused),
            compile_s
``cell``    a per-cell record: name (cell id), execution_count, t, wall_s, dur_s
            (device_s: host seconds in launches), modelled_s, peak_bytes
``memory``  a memory sample: t, bytes (allocated), peak, capacity
``meta``    one row: chip, capacity, peak, count (OOMs), ops (NEURON_LAB_MIN_REGION_OPS),
            status ("compile-on" | "compile-off"), schema
==========  ==========================================================================
"""
from __future__ import annotations

import json

from .export import export_table, read_table
from .recording import Recording

SCHEMA = "neuron_lab.trace/1"
COLUMNS = ("event", "name", "kind", "t", "dur_s", "modelled_s", "bytes", "flops", "region",
           "ops", "op_names", "location", "locations", "source", "reason", "count", "status",
           "error", "per_op_launches", "fused_launches", "per_op_modelled_s", "compile_s",
           "correlation", "thread", "execution_count", "wall_s", "peak", "capacity", "chip",
           "schema")


def _row(event: str, **kw) -> dict:
    row = dict.fromkeys(COLUMNS)
    row["event"] = event
    for k, v in kw.items():
        row[k] = json.dumps(v) if isinstance(v, (list, tuple, dict)) else v
    return row


def trace_rows(rec: Recording, launches: list, memory: list) -> list[dict]:
    """Rows of the trace file from a ``Recording``, the device launches (``DeviceLaunch``) and
    memory samples."""
    rows = [_row("meta", chip=rec.chip, capacity=rec.capacity, peak=rec.peak_bytes,
                 count=rec.ooms, ops=rec.min_region_ops,
                 status="compile-on" if rec.compile_on else "compile-off", schema=SCHEMA)]
    for d in launches:
        rows.append(_row("launch", name=d.name, kind=d.kind, t=d.start, dur_s=d.executor_s,
                         modelled_s=d.modelled_s, bytes=d.bytes, flops=d.flops,
                         region=d.region, ops=d.ops, op_names=d.op_names, location=d.location,
                         correlation=d.correlation, thread=d.thread, chip=rec.chip))
    for s in rec.syncs:
        rows.append(_row("sync", reason=s["reason"], location=s["location"],
                         source=s["source"], count=s["count"]))
    for b in rec.boundaries:
        rows.append(_row("boundary", reason=b["reason"], location=b["location"],
                         source=b["source"], count=b["count"], ops=b["ops"]))
    for f in rec.fallbacks:
        locs = list(f.get("locations") or [])
        rows.append(_row("fallback", name=f["op"], reason=f["reason"], count=f["count"],
                         location=locs[0] if locs else None, locations=locs,
                         source=dict(f.get("source") or {})))
    for r in rec.regions:
        rows.append(_row("region", region=r["id"], ops=r["ops"], status=r["status"],
                         error=r.get("error"), per_op_launches=r["per_op_launches"],
                         fused_launches=r["fused_launches"], op_names=r["op_names"],
                         location=r["location"], per_op_modelled_s=r["per_op_modelled_s"],
                         modelled_s=r["fused_modelled_s"], compile_s=r.get("compile_s")))
    for c in rec.cells:
        rows.append(_row("cell", name=c.get("cell_id"), execution_count=c.get("execution_count"),
                         t=c.get("started"), wall_s=c.get("wall_s"), dur_s=c.get("device_s"),
                         modelled_s=c.get("modelled_s"), peak=c.get("peak_bytes")))
    for m in memory:
        rows.append(_row("memory", t=m["t"], bytes=m["allocated"], peak=m["peak"],
                         capacity=m["capacity"]))
    return rows


def write_trace(rec: Recording, launches: list, memory: list, path_base: str) -> str:
    """Write ``path_base.parquet`` (``.csv`` without pyarrow); returns the path."""
    return export_table(trace_rows(rec, launches, memory), path_base)


def _json(v, default):
    if v is None:
        return default
    return v if not isinstance(v, str) else json.loads(v)


def read_recording(path: str) -> tuple[Recording, list[dict]]:
    """The ``Recording`` a trace file holds, and its launch rows."""
    rows = read_table(path)
    by: dict = {}
    for r in rows:
        by.setdefault(r["event"], []).append(r)
    meta = (by.get("meta") or [{}])[0]
    if meta.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a neuron_lab trace file (schema {meta.get('schema')!r}, "
                         f"expected {SCHEMA!r}); write one with neuron_lab.profile(out_dir)")
    syncs = [{"reason": r["reason"], "location": r["location"], "source": r["source"] or "",
              "count": int(r["count"])} for r in by.get("sync", [])]
    bounds = [{"reason": r["reason"], "location": r["location"], "source": r["source"] or "",
               "count": int(r["count"]), "ops": int(r["ops"] or 0)} for r in by.get("boundary", [])]
    falls = [{"op": r["name"], "reason": r["reason"], "count": int(r["count"]),
              "locations": _json(r["locations"], []), "source": _json(r["source"], {})}
             for r in by.get("fallback", [])]
    regions = [{"id": int(r["region"]), "ops": int(r["ops"]), "status": r["status"],
                "error": r["error"], "per_op_launches": int(r["per_op_launches"]),
                "fused_launches": int(r["fused_launches"]),
                "op_names": _json(r["op_names"], []), "location": r["location"],
                "per_op_modelled_s": r["per_op_modelled_s"] or 0.0,
                "fused_modelled_s": r["modelled_s"] or 0.0, "compile_s": r["compile_s"]}
               for r in by.get("region", [])]
    cells = [{"cell_id": r["name"], "execution_count": r["execution_count"],
              "started": r["t"], "wall_s": r["wall_s"], "device_s": r["dur_s"] or 0.0,
              "modelled_s": r["modelled_s"], "peak_bytes": r["peak"] or 0}
             for r in by.get("cell", [])]
    launches = sorted(by.get("launch", []), key=lambda r: r["t"])
    spans = [{"t": r["t"] + r["dur_s"], "seconds": r["dur_s"], "modelled_s": r["modelled_s"]}
             for r in launches]
    for b in (syncs, bounds):
        b.sort(key=lambda r: -r["count"])
    rec = Recording(meta.get("chip") or "trn2", syncs, bounds, falls, regions, cells, spans,
                    int(meta.get("capacity") or 0), int(meta.get("peak") or 0),
                    int(meta.get("count") or 0), int(meta.get("ops") or 0),
                    meta.get("status") == "compile-on")
    return rec, launches
