"""metrics() is JSON-safe and carries real numbers; profile() exports a loadable Chrome trace
with the runtime's launch ranges and tables that round-trip."""
import csv
import json

import pyarrow.parquet as pq
import torch

import neuron_lab
from neuron_lab import runtime
from neuron_lab.runtime import knobs
from neuron_lab.telemetry import export_table


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
    trace = json.load(open(prof.trace_path))
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any(n.startswith("neuron::per-op[region") for n in names), sorted(names)[:20]
    table = pq.read_table(prof.launches_path).to_pylist()
    assert len(table) == len(prof.launches) >= 3
    assert all(r["kind"] == "per-op" and r["ops"] == 3 for r in table)   # mul, add, sum


def test_tables_round_trip_csv_and_parquet(tmp_path, monkeypatch):
    rows = [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    p = export_table(rows, str(tmp_path / "t"))
    assert pq.read_table(p).to_pylist() == rows
    import builtins
    real_import = builtins.__import__

    def no_pyarrow(name, *a, **k):
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    p = export_table(rows, str(tmp_path / "t2"))
    assert p.endswith(".csv")
    assert [dict(r, a=int(r["a"])) for r in csv.DictReader(open(p))] == rows
