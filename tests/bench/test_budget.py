"""The bench's equal core budget: every peer is sampled under the same affinity mask (its threads
and its helper processes included) with the garbage collector on, and the CPU seconds of each
sample are measured beside its wall time. No timing is asserted.

The pinning runs in a child process so that this test process keeps its own cores.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from neuron_lab.bench import budget, harness, peers, report

needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity")
                                    or not os.path.exists("/proc/self/task"),
                                    reason="needs Linux affinity and /proc")

_CHILD = textwrap.dedent("""
    import gc, json, os, subprocess, sys
    import torch
    import neuron_lab
    from neuron_lab.bench import budget, harness, peers

    b = budget.make("one-core")
    budget.apply(b)

    def run(peer, cfg):
        x = torch.randn(256).to(peer.device)

        def it():
            junk = [[] for _ in range(2000)]          # cyclic-free garbage: young collections
            for j in junk[:500]:
                j.append(junk)                        # ... and cycles for the collector to find
            (x * 2 + 1).sum().item()
        return {"steady": harness.steady(it, peer, cfg, end=peer.sync,
                                         t=lambda s: s, cpu={"c": lambda c: c})}

    w = harness.Workload("WB", "budget", [harness.Metric("t", "s"), harness.Metric("c", "s")], run)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        res = harness.run_workload(w, peers.make(("native", "neuron_eager", "neuron_adaptive")),
                                   harness.Config.make(True), log=lambda s: None)
    finally:
        sleeper.kill()
        sleeper.wait()
    helper_mask = None
    try:                                              # the adaptive runtime's compile helper
        from neuron_lab.runtime import helper
        p = helper._started()
        if p is not None:
            helper_mask = budget._mask(f"/proc/{p.pid}/status")
            helper.stop()
    except (ImportError, AttributeError):
        pass
    print(json.dumps({"budget": b.describe(), "result": res, "helper_mask": helper_mask,
                      "gc_enabled": gc.isenabled()}, default=str))
""")


@needs_affinity
def test_every_peer_is_sampled_on_the_same_core_with_the_collector_on():
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    cpus = out["budget"]["cpus"]
    assert len(cpus) == 1 and out["budget"]["threads"] == 1
    cond = out["result"]["extra"]["conditions"]
    assert set(cond) == {"native", "neuron_eager", "neuron_adaptive"}
    seen = {p: c["seen"] for p, c in cond.items()}
    for p, conds in seen.items():
        for c in conds:
            assert c["thread_masks"] == [cpus], (p, c)           # every thread, device's included
            assert c["child_masks"] in ([], [cpus]), (p, c)      # helper processes inherit it
            assert c["torch_threads"] == 1 and c["gc_enabled"] is True, (p, c)
    same = ("thread_masks", "child_masks", "torch_threads", "gc_enabled")
    masks = {p: {json.dumps([c[k] for k in same]) for c in conds} for p, conds in seen.items()}
    assert all(masks[p] == masks["native"] for p in masks), masks   # the same for every peer
    assert max(c["threads"] for c in seen["neuron_adaptive"]) >= 2   # the device's thread too
    assert any(c["child_masks"] == [cpus] for c in seen["native"])   # the sleeper was seen
    for p, c in cond.items():
        g = c["gc"]["steady"]
        assert g["enabled"] is True, p
        assert sum(g["collections_per_sample"]) > 0, p          # it ran inside the samples
    for m in ("t", "c"):
        for p, e in out["result"]["metrics"][m]["peers"].items():
            assert "median" in e and all(s >= 0 for s in e["samples"]), (m, p, e)
    if out["helper_mask"] is not None:
        assert out["helper_mask"] == cpus
    assert out["gc_enabled"] is True


def test_budgets():
    allowed = budget.allowed()
    one, every = budget.make("one-core"), budget.make("all-cores")
    assert one.cpus == (allowed[0],) and one.threads == 1
    assert every.cpus == allowed and every.threads == len(allowed)
    with pytest.raises(ValueError):
        budget.make("half-cores")


def test_cpu_seconds_include_children():
    c0 = budget.cpu_start()
    subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)
    c1 = budget.cpu_stop()
    assert c1 > c0                   # the reaped child's CPU time is counted


def test_training_variants_and_explicit_optimizer():
    """W3 on CPU eager alone: both sync variants, each with its CPU cost; AdamW built as set."""
    from neuron_lab.bench import models, training
    models.set_optimizer("single-tensor")
    try:
        _, opt, _ = models.make("mlp", peers.make(("native",))[0])
        assert opt.defaults["foreach"] is False
    finally:
        models.set_optimizer("foreach")
    _, opt, _ = models.make("mlp", peers.make(("native",))[0])
    assert opt.defaults["foreach"] is True
    tiny = harness.Config(quick=True, warm_s=0.05, sample_s=0.01, repeats=3, sampling_budget_s=0.5)
    res = harness.run_workload(training.W3, peers.make(("native",)), tiny, log=lambda s: None)
    n = training.SYNCN
    for m in ("steps_per_s", "cpu_ms_per_step", f"steps_per_s_{n}", f"cpu_ms_per_step_{n}"):
        assert "median" in res["metrics"][m]["peers"]["native"], m
    assert set(res["extra"]["conditions"]["native"]["gc"]) == {"steady", f"steady_{n}"}


def _fake_run(name: str, fails: bool) -> dict:
    err = {"skip": "error: RuntimeError: boom"} if fails else {"median": 2.0, "samples": [2.0]}
    return {"schema": report.SCHEMA, "seconds": 1.0, "cache": {"state": "warm", "entries_before": 1},
            "machine": {"torch": "2.x", "cores": 2, "cpu": "x", "threads": 1, "load_before": 0.1,
                        "load_after": 0.2},
            "budget": {"name": name, "cpus": [0], "threads": 1},
            "config": {"quick": True, "optimizer": "foreach"},
            "peers": ["native", "lazy"], "labels": {"native": "CPU eager", "lazy": "torch._lazy"},
            "workloads": {"W6": {"title": "t", "metrics": {"steps_per_s": {
                "unit": "steps/s, sync every step", "better": "higher", "log": False,
                "peers": {"native": {"median": 1.0, "samples": [1.0]}, "lazy": err}}},
                "ratios": [{"label": "W6 x / y", "num": ["steps_per_s", "lazy"],
                            "den": ["steps_per_s", "native"], "op": ">=", "target": 1.0,
                            "value": None if fails else 2.0, "met": None if fails else True}]}}}


def test_report_says_fails_and_regenerates_the_readme_block(tmp_path):
    res = report.combine([_fake_run("one-core", True), _fake_run("all-cores", False)])
    assert len(report.runs(res)) == 2 and report.runs(_fake_run("x", False))[0]["budget"]
    one = report.table(report.runs(res)[0])
    assert "fails[1]" in one and "[1] torch._lazy: error: RuntimeError: boom" in one
    md = report.markdown(res)
    assert "**one-core**" in md and "**all-cores**" in md and "| W6 x / y (>= 1.00×) | — | 2.00× |" in md
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.BEGIN}\nold\n{report.END}\nafter\n")
    report.update_readme(res, str(readme))
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("after\n") and "old" not in text
    assert report.markdown(res, short=True) in text
    js = tmp_path / "r.json"
    js.write_text(json.dumps(res))
    proc = subprocess.run([sys.executable, "-m", "neuron_lab.bench", "--table", str(js)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "### one-core" in proc.stdout and "fails[1]" in proc.stdout
