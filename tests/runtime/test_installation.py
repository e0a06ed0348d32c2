"""``runtime.Runtime`` objects: each holds its own regions, programs and counters; installing
one routes the device to it and runs what the one before had queued; the layers above read
snapshots that do not move with the engine (the benchmark's neuron peers each run with a
runtime of their own in one process)."""
import dataclasses
import math

import pytest
import torch

from neuron_lab import runtime
from neuron_lab.runtime import knobs


def _loop(x, steps=4, k=1.5):
    outs = []
    for _ in range(steps):
        y = (x * k).sin().add(0.25)
        outs.append(y.sum().item())
    return outs


def _close(xs, ys) -> bool:
    """Fused programs equal CPU within float32 rounding (their reductions may sum in another
    order): relative 1e-6."""
    return len(xs) == len(ys) and all(math.isclose(x, y, rel_tol=1e-6) for x, y in zip(xs, ys))


def test_each_runtime_keeps_its_regions(fresh_engine):
    a, b = torch.randn(64), torch.randn(16, 8)
    na, nb = a.to("neuron"), b.to("neuron")
    mine_rt = runtime.current()
    with knobs.TRIALS.scoped(0):
        assert _close(_loop(na), _loop(a))
        mine = runtime.stats()
        assert mine["misses"] >= 1 and runtime.regions()
        other = runtime.Runtime()
        assert not other.installed and other.stats()["misses"] == 0 and other.regions() == []
        with runtime.installed(other):
            assert runtime.current() is other and runtime.regions() == []
            _loop(nb, k=0.5)
            assert runtime.stats()["misses"] >= 1
        assert runtime.current() is mine_rt
        assert runtime.stats()["misses"] == mine["misses"]
        assert _close(_loop(na), _loop(a))
        after = runtime.stats()
        assert after["misses"] == mine["misses"]     # its region hit: nothing recaptured
        assert after["hits"] > mine["hits"] and after["launches_fused"] > mine["launches_fused"]
        assert other.stats()["hits"] >= 1 and other.regions()    # kept while not installed


def test_installing_another_runs_what_is_queued(fresh_engine):
    x = torch.randn(32)
    with knobs.COMPILE.scoped(False):
        for _ in range(3):                           # a known region: the next ops are deferred
            (x.to("neuron") * 2).cos().sum().item()
        y = (x.to("neuron") * 2).cos()
        assert runtime.stats()["queue_depth"] > 0
        with runtime.installed(runtime.Runtime()):
            assert runtime.stats()["queue_depth"] == 0
            torch.testing.assert_close(y.cpu(), (x * 2).cos(), rtol=0, atol=0)
        assert runtime.stats()["queue_depth"] == 0


def test_reset_forgets_and_keeps_working(fresh_engine):
    x = torch.randn(32, device="neuron")
    with knobs.COMPILE.scoped(False):
        _loop(x)
        assert runtime.regions()
        runtime.reset()
        assert runtime.regions() == [] and runtime.stats()["hits"] == 0
        assert _close(_loop(x), _loop(x.cpu()))


def test_snapshots_are_copies(fresh_engine):
    x = torch.randn(32, device="neuron")
    with knobs.COMPILE.scoped(False):
        _loop(x, steps=3)
        (snap,) = [r for r in runtime.current().regions() if r.ops >= 3]
        hits = snap.hits
        _loop(x, steps=3)
    assert snap.hits == hits                          # taken at the call: it does not move
    assert runtime.current().region(snap.id).hits > hits
    assert runtime.current().region(10 ** 9) is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.hits = 0
    s = snap.summary()
    assert s["id"] == snap.id and s["first_ops"] == list(snap.names[:6])
    counts = runtime.current().launches()
    assert counts.per_op == runtime.stats()["launches_per_op"] and counts.per_op > 0


def test_current_names_the_fix_when_nothing_is_installed(monkeypatch):
    from neuron_lab.runtime import installation
    monkeypatch.setattr(installation, "_current", None)
    with pytest.raises(RuntimeError, match="import neuron_lab"):
        runtime.current()
