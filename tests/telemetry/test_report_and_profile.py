"""metrics() is JSON-safe and carries real numbers; profile() exports a loadable Chrome trace
with the runtime's launch ranges, a memory counter track and fallback markers, and tables that
round-trip through Parquet and CSV."""
import inspect
import json
import time

import pyarrow.parquet as pq
import torch

import neuron_lab
from neuron_lab import runtime
from neuron_lab.runtime import knobs
from neuron_lab.telemetry import export_table, read_table


def test_metrics_snapshot_is_json_and_real():
    neuron_lab.clear_op_tracking()
    x = torch.ones(256, device="neuron")
    (x * 2).sum().item()
    m = json.loads(json.dumps(neuron_lab.metrics()))
    assert m["device"] == "neuron:0" and m["memory"]["allocated"] >= 1024
    assert m["executed_ops"]["aten::mul.Tensor"] >= 1
    assert m["counters"]["syncs"]["item"] >= 1
    report = neuron_lab.metrics_report()
    assert "Metric: RegionCache" in report and "aten::mul.Tensor" in report


def test_profile_exports_trace_with_launch_ranges(tmp_path):
    runtime.reset()
    x = torch.ones(512, device="neuron")
    neuron_lab.sync()
    with knobs.COMPILE.scoped(False), neuron_lab.profile(str(tmp_path)) as prof:
        for _ in range(4):
            (x * 2 + 1).sum().item()
        big = torch.empty(1 << 18, device="neuron")                      # 1 MiB
        time.sleep(0.2)
        line = inspect.currentframe().f_lineno + 1
        torch.ones(3, device="neuron", dtype=torch.float64).sum()
    trace = json.load(open(prof.trace_path))
    events = trace["traceEvents"]
    names = {e.get("name", "") for e in events}
    assert any(n.startswith("neuron::per-op[region") for n in names), sorted(names)[:20]
    launches = [e for e in events if e.get("name", "").startswith("neuron::per-op[")]
    mem = [e for e in events if e.get("name") == "neuron memory"]
    assert mem and max(e["args"]["allocated"] for e in mem) >= 1 << 20
    t_launch = min(e["ts"] for e in launches)             # same clock as the profiler's ranges
    assert min(e["ts"] for e in mem) <= t_launch <= max(e["ts"] for e in mem)
    fb = [e for e in events if e.get("name") == "neuron fallback: aten::sum"]
    assert fb and fb[0]["ph"] == "i" and fb[0]["args"]["location"].endswith(f":{line}")
    table = pq.read_table(prof.launches_path).to_pylist()
    assert len(table) == len(prof.launches) >= 3
    assert all(r["ops"] == 3 for r in table if r["kind"] == "per-op")   # mul, add, sum
    assert prof.peak_bytes >= 1 << 20
    fbs = read_table(prof.fallbacks_path)
    assert any(r["op"] == "aten::sum" and str(line) in r["locations"] for r in fbs)
    del big


def test_tables_round_trip_csv_and_parquet(tmp_path, monkeypatch):
    rows = [{"a": 1, "b": "x", "f": 0.5, "loc": ["f.py:1"]}, {"a": 2, "b": "y", "f": None, "loc": []}]
    flat = [dict(r, loc=json.dumps(r["loc"])) for r in rows]     # nested values as JSON text
    p = export_table(rows, str(tmp_path / "t"))
    assert p.endswith(".parquet") and read_table(p) == flat
    import builtins
    real_import = builtins.__import__

    def no_pyarrow(name, *a, **k):
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    p = export_table(rows, str(tmp_path / "t2"))
    assert p.endswith(".csv") and read_table(p) == flat
