"""NEURON_LAB_VERIFY: a fused program's first launches are checked against per-op replay.

A deliberately wrong program (the compiler's output patched to add 1 to every result) is
caught at its first launch: the user's values are the per-op ones, the region turns per-op, the
mismatch is counted, reported in metrics() and warned about. Without the check the same wrong
program's numbers reach the user, which is what the check is for.
"""
import pytest
import torch

import neuron_lab
from neuron_lab import runtime
from neuron_lab.runtime import knobs, programs


def _step(x, w):
    return (torch.tanh(x * 1.5) @ w + x).relu().sum(dim=0)


def _run(x, w, n=6):
    outs = []
    for _ in range(n):
        y = _step(x, w)
        y.sum().item()
        outs.append(y.cpu())
    return outs


@pytest.fixture
def miscompiled(monkeypatch):
    real = programs.compile_program

    def wrong(*a, **k):
        program = real(*a, **k)
        return lambda *inputs: tuple(o + 1 for o in program(*inputs))

    monkeypatch.setattr(programs, "compile_program", wrong)


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(6, 6, generator=g), torch.randn(6, 6, generator=g)
    return x, w, _step(x, w)


def test_verify_catches_a_miscompile(miscompiled, data):
    x, w, expect = data
    neuron_lab.metrics()         # telemetry listening
    with knobs.VERIFY.scoped(True), knobs.TRIALS.scoped(0), pytest.warns(RuntimeWarning,
                                                                        match="disagrees"):
        outs = _run(x.to("neuron"), w.to("neuron"))
    for y in outs:
        torch.testing.assert_close(y, expect, rtol=1e-5, atol=1e-5)
    (r,) = [r for r in runtime.regions() if r["error"]]
    assert r["status"] == "failed" and r["error"].startswith("verify: output")
    s = runtime.stats()
    assert s["verify_mismatches"] == 1 and s["launches_fused"] == 0
    assert any(c["outcome"] == "failed" and "verify" in (c["error"] or "")
               for c in neuron_lab.metrics()["compiles"])


def test_without_verify_the_miscompile_reaches_the_user(miscompiled, data):
    x, w, expect = data
    with knobs.TRIALS.scoped(0):
        outs = _run(x.to("neuron"), w.to("neuron"))
    assert runtime.stats()["launches_fused"] > 0
    assert not torch.allclose(outs[-1], expect)


def test_verified_region_then_runs_fused(data):
    x, w, expect = data
    with knobs.VERIFY.scoped(True), knobs.TRIALS.scoped(0), knobs.VERIFY_LAUNCHES.scoped(2):
        outs = _run(x.to("neuron"), w.to("neuron"), n=8)
    for y in outs:
        torch.testing.assert_close(y, expect, rtol=1e-5, atol=1e-5)
    s = runtime.stats()
    assert s.get("verify_mismatches", 0) == 0
    (r,) = [r for r in runtime.regions() if r["status"] == "fused"]
    assert r["fused_launches"] > 0
