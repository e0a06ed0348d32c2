"""Runtime test fixtures: a fresh region cache per test, compiles in the foreground.

``NEURON_LAB_SYNC_COMPILE`` makes compiles deterministic (the test does not race the worker);
``compile_off`` keeps tests that only check region formation from paying inductor's cost.
"""
import pytest
import torch

import neuron_lab
from neuron_lab import runtime
from neuron_lab.runtime import knobs


@pytest.fixture(autouse=True)
def fresh_engine():
    # no background compile (of this file's tests or of another file run before on this
    # worker) runs into a test: the tests here count regions, launches and memory exactly
    runtime.wait_compiles(None)
    runtime.reset()
    with knobs.SYNC_COMPILE.scoped(True), neuron_lab.mode("adaptive"):
        yield runtime.current().engine
    runtime.wait_compiles(None)
    runtime.reset()


@pytest.fixture
def compile_off():
    with knobs.COMPILE.scoped(False):
        yield


def _both_modes(fn, *args):
    """Run ``fn`` in eager and adaptive mode; returns (eager result, adaptive result) on CPU."""
    out = {}
    for m in ("eager", "adaptive"):
        with neuron_lab.mode(m):
            r = fn(*args)
            neuron_lab.sync()
            out[m] = torch.utils._pytree.tree_map(
                lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, r)
    return out["eager"], out["adaptive"]


@pytest.fixture
def both_modes():
    return _both_modes
