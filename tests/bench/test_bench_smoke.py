"""Smoke test of ``python -m neuron_lab.bench``: the CLI runs, writes its JSON and plot, and every
peer yields a number or a recorded skip reason for every metric. No timing is asserted: the
numbers depend on the machine and on whatever else runs on it.

The CLI run uses ``--quick`` on a tiny subset (W1 on every peer, W1T, W5) on the one-core budget;
the report/harness checks below use synthetic results and run in milliseconds.
"""
import json
import os
import subprocess
import sys

import pytest

from neuron_lab.bench import WORKLOADS, harness, peers, report

SUBSET = ("W1", "W1T", "W5")


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    js, png = out / "bench.json", out / "bench.png"
    cmd = [sys.executable, "-m", "neuron_lab.bench", "--quick", "--budget", "one-core",
           "--only", ",".join(SUBSET), "--json", str(js), "--plot", str(png)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc, json.loads(js.read_text()), png


def test_json_schema(cli_run):
    _, res, _ = cli_run
    assert res["schema"] == "neuron_lab.bench/2"
    for key in ("torch", "cores", "threads", "cpu", "load_before", "load_after"):
        assert key in res["machine"]
    assert res["machine"]["threads"] == 1
    assert res["budget"]["name"] == "one-core" and len(res["budget"]["cpus"]) == 1
    assert res["config"]["optimizer"] == "foreach"
    conds = res["workloads"]["W1"]["extra"]["conditions"]
    masks = {p: [c["thread_masks"] for c in conds[p]["seen"]] for p in conds}
    assert all(m == [[res["budget"]["cpus"]]] for m in masks.values()), masks
    assert res["cache"]["state"] in ("cold", "warm")
    assert res["copy_bandwidth_GBps"] > 0
    assert res["parallel_op_us"]["start"] > 0 and res["parallel_op_us"]["end"] > 0
    assert res["peers"] == list(peers.ORDER)
    assert set(res["workloads"]) == set(SUBSET)
    w1 = res["modelled_trn2"]["W1"]                       # W1 is the only modelled one here
    assert set(res["modelled_trn2"]) == {"W1"}
    assert w1["eager"]["launches"] == 65                  # 64 ops and the .item(), each a launch
    assert w1["adaptive"]["launches"] < w1["eager"]["launches"]
    assert w1["eager"]["flops"] == w1["adaptive"]["flops"] and w1["speedup"] > 1
    share = res["workloads"]["W1"]["extra"]["neuron_adaptive"]["device_thread_busy_share"]
    assert share is not None and 0 <= share <= 1      # of the sampled time: W1 reads each run
    for w in res["workloads"].values():
        assert w["title"] and w["seconds"] >= 0
        for r in w["ratios"]:
            assert {"label", "num", "den", "op", "target", "value", "met"} <= set(r)


def test_every_peer_has_a_number_or_a_reason(cli_run):
    _, res, _ = cli_run
    for key, w in res["workloads"].items():
        for name, m in w["metrics"].items():
            assert set(m["peers"]) == set(peers.ORDER), (key, name)
            for peer, e in m["peers"].items():
                if "skip" in e:
                    assert isinstance(e["skip"], str) and e["skip"], (key, name, peer)
                else:
                    assert e["samples"] and all(isinstance(s, float) for s in e["samples"])
                    assert min(e["samples"]) <= e["median"] <= max(e["samples"]), (key, name, peer)
    w1 = res["workloads"]["W1"]["metrics"]["us_per_op"]["peers"]
    assert "median" in w1["native"] and "median" in w1["neuron_eager"]


def test_table_and_plot(cli_run):
    proc, res, png = cli_run
    assert "| W1 |" in proc.stdout and "| target |" in proc.stdout
    assert png.stat().st_size > 1000
    assert report.table(res) in proc.stdout


def test_the_report_warns_when_the_parallel_op_canary_slowed(cli_run):
    """A run whose canary ran more than ``canary.LIMIT`` times slower at its end says so in its
    header: a peer may have left a thread that slows every later peer's OpenMP work."""
    from neuron_lab.bench import canary
    _, res, _ = cli_run
    start = res["parallel_op_us"]["start"]
    assert "parallel-op canary" in report.header(res)
    slowed = {**res, "parallel_op_us": {"start": start, "end": start * (canary.LIMIT + 0.5)}}
    assert "**Warning:** the parallel-op canary" in report.header(slowed)
    steady = {**res, "parallel_op_us": {"start": start, "end": start * canary.LIMIT}}
    assert "Warning" not in report.header(steady)
    assert canary.check(None, 3.0) is None


def test_driver_records_errors_as_skips():
    def run(peer, cfg):
        if peer.name == "native":
            raise RuntimeError("boom")
        if peer.name == "compile":
            raise harness.Skip("not today")
        return {"t": [1.0, 2.0, 3.0], "extra": {"x": 1}}

    w = harness.Workload("WX", "fake", [harness.Metric("t", "s")], run,
                         [harness.Ratio("eager/adaptive", ("t", "neuron_eager"), ("t", "neuron_adaptive"), "<=", 1.0)],
                         peers=("native", "compile", "neuron_eager", "neuron_adaptive"))
    ps = peers.make(("native", "neuron_eager", "neuron_adaptive", "compile"))
    res = harness.run_workload(w, ps, harness.Config.make(True), log=lambda s: None)
    got = res["metrics"]["t"]["peers"]
    assert got["native"]["skip"].startswith("error: RuntimeError: boom")
    assert "boom" in res["extra"]["errors"]["native"]
    assert got["compile"] == {"skip": "not today"}
    assert got["neuron_eager"]["median"] == 2.0
    assert res["ratios"][0]["value"] == 1.0 and res["ratios"][0]["met"] is True


def test_fresh_samples_are_taken_round_robin_after_every_set_up():
    """``harness.Fresh`` metrics (W4's first step) are sampled like the steady ones: after all
    set-ups, sample r of every peer before sample r + 1, so a slow spell of the machine does not
    land on one peer only."""
    order = []

    def run(peer, cfg):
        order.append(("set-up", peer.name))
        return {"t": harness.Fresh(lambda: order.append(peer.name) or 1.0, 3)}

    w = harness.Workload("WX", "fake", [harness.Metric("t", "s")], run, [],
                         peers=("native", "neuron_eager"))
    ps = peers.make(("native", "neuron_eager"))
    res = harness.run_workload(w, ps, harness.Config.make(True), log=lambda s: None)
    assert order == [("set-up", "native"), ("set-up", "neuron_eager")] + [
        "native", "neuron_eager"] * 3
    assert res["metrics"]["t"]["peers"]["native"]["samples"] == [1.0, 1.0, 1.0]


def test_workload_registry():
    assert list(WORKLOADS) == ["W1", "W1T", "W2", "W3", "W4", "W5", "W6", "W7"]
    for w in WORKLOADS.values():
        assert w.metrics and all(m.better in ("lower", "higher") for m in w.metrics)


@pytest.mark.slow
def test_w7_measures_steps_while_compiling():
    """W7 in its child process (empty inductor cache): steps overlapped a real compile and the
    slowdown is a ratio to the eager step (~20 s: one cold compile of W3's regions)."""
    from neuron_lab.bench.compiling import run_w7
    from neuron_lab.bench.harness import Config

    class Adaptive:
        name = "neuron_adaptive"
    out = run_w7(Adaptive, Config.make(quick=True))
    [extra] = out["extra"]["runs"]                        # one child with --quick
    assert extra["compiles"] >= 1 and extra["compiles_failed"] == 0
    assert extra["steps_overlapping"] >= 10 and extra["eager_step_ms"] > 0
    assert extra["eager_before_ms"] > 0 and extra["eager_after_ms"] > 0   # brackets the compiles
    [slowdown], [worst] = out["slowdown"], out["worst_ms"]
    assert 0.3 < slowdown < 50 and worst >= extra["eager_step_ms"]
