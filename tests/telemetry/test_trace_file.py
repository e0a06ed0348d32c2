"""Analysis from the file alone (issue 44): profile() writes trace.parquet (device launches and
what advise() reads); `python -m neuron_lab analyze trace.parquet` prints advise()'s findings
from it, in a process that recorded nothing."""
import json
import subprocess
import sys

import torch

import neuron_lab
from neuron_lab.runtime import knobs
from neuron_lab.telemetry.analyze import analyze, summary
from neuron_lab.telemetry.export import read_table


def _loop(x, steps=6):
    total = 0.0
    for _ in range(steps):
        y = (x * 2 + 1).relu()
        z = (y.double() * 3).sum()   # FLOAT64-LINE
        total += y.sum().item()      # ITEM-LINE
        total += float(z)
    return total


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if f"# {marker}" in line)


def test_analyze_finds_item_and_float64_slip_at_their_lines(tmp_path):
    neuron_lab.clear_op_tracking()
    x = torch.randn(64, device="neuron")
    with knobs.COMPILE.scoped(False):
        with neuron_lab.profile(str(tmp_path), trace=False, tables=True) as prof:
            _loop(x)
    path = prof.trace_file_path
    assert path.endswith("trace.parquet")
    rows = read_table(path)
    kinds = {r["event"] for r in rows}
    assert {"meta", "launch", "sync", "fallback", "region"} <= kinds
    launches = [r for r in rows if r["event"] == "launch"]
    assert launches and all(r["modelled_s"] > 0 and r["dur_s"] > 0 for r in launches)
    # the offline analysis, in a fresh process: the file alone
    out = subprocess.run([sys.executable, "-m", "neuron_lab", "analyze", path, "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout)
    item = f"test_trace_file.py:{_line('ITEM-LINE')}"
    slip = f"test_trace_file.py:{_line('FLOAT64-LINE')}"
    syncs = [f for f in found if f["kind"] == "host-sync-in-loop"]
    falls = [f for f in found if f["kind"] == "fallback-hot"]
    assert any(f["where"].endswith(item) and f["count"] == 6 for f in syncs), syncs
    assert any(f["where"].endswith(slip) and "float64" in f["message"] for f in falls), falls
    # the same findings as advise() on the live process, for those two kinds
    live = {(f["kind"], f["where"]) for f in neuron_lab.advise()
            if f["kind"] in ("host-sync-in-loop", "fallback-hot")}
    assert {(f["kind"], f["where"]) for f in syncs + falls} <= live
    assert analyze(path) == found
    text = summary(path)             # what `python -m neuron_lab analyze PATH` prints
    assert "host-sync-in-loop" in text and item in text and slip in text
