"""Shared fixtures: run a test in a given runtime mode, with op tracking cleared.

``eager``: the per-op path, where results must equal CPU bitwise. ``any_mode``: the test runs
twice, eager and adaptive. Adaptive runs with compiling off — device tests check op semantics,
fused programs (and their tolerance) are tests/runtime's — so its per-op replays are bitwise too.
"""
import os

import pytest

# The suite keeps both cores busy (one pytest-xdist worker each): a compile helper below the
# workers' priority (the default, NEURON_LAB_COMPILE_NICE=10) would get a tenth of a core, and
# the tests that wait for compiles would wait ten times as long. Nothing here times a loop.
os.environ.setdefault("NEURON_LAB_COMPILE_NICE", "0")

import neuron_lab


@pytest.fixture
def eager():
    neuron_lab.clear_op_tracking()
    with neuron_lab.mode("eager"):
        yield "eager"


@pytest.fixture(params=["eager", "adaptive"])
def any_mode(request):
    from neuron_lab.runtime import knobs
    neuron_lab.clear_op_tracking()
    with knobs.COMPILE.scoped(False), neuron_lab.mode(request.param):
        yield request.param
        neuron_lab.sync()

