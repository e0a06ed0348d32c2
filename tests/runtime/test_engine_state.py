"""``runtime.switch_state``: the engine holds one set of learned regions at a time; a state put
aside keeps its regions, programs and counters, and comes back as it was (the benchmark's
neuron peers each run with their own regions in one process)."""
import math

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


def test_each_state_keeps_its_regions(fresh_engine):
    a, b = torch.randn(64), torch.randn(16, 8)
    na, nb = a.to("neuron"), b.to("neuron")
    with knobs.TRIALS.scoped(0):
        assert _close(_loop(na), _loop(a))
        mine = runtime.stats()
        assert mine["misses"] >= 1 and runtime.regions()
        theirs = runtime.switch_state(None)          # a fresh engine: nothing learned
        assert runtime.stats()["misses"] == 0 and runtime.regions() == []
        _loop(nb, k=0.5)
        other = runtime.switch_state(theirs)         # the first state again
        assert runtime.stats()["misses"] == mine["misses"]
        assert _close(_loop(na), _loop(a))
        after = runtime.stats()
        assert after["misses"] == mine["misses"]     # its region hit: nothing recaptured
        assert after["hits"] > mine["hits"] and after["launches_fused"] > mine["launches_fused"]
        runtime.switch_state(other)
        assert [r["ops"] for r in runtime.regions()] and runtime.stats()["hits"] >= 1


def test_switching_runs_what_is_queued(fresh_engine):
    x = torch.randn(32)
    with knobs.COMPILE.scoped(False):
        for _ in range(3):                           # a known region: the next ops are deferred
            (x.to("neuron") * 2).cos().sum().item()
        y = (x.to("neuron") * 2).cos()
        assert runtime.stats()["queue_depth"] > 0
        held = runtime.switch_state(None)
        assert runtime.stats()["queue_depth"] == 0
        torch.testing.assert_close(y.cpu(), (x * 2).cos(), rtol=0, atol=0)
        runtime.switch_state(held)
