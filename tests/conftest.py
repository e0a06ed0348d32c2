"""Shared fixtures: run a test in a given runtime mode, with op tracking cleared.

``eager``: the per-op path, where results must equal CPU bitwise. ``any_mode``: the test runs
twice, eager and adaptive. Adaptive runs with compiling off — device tests check op semantics,
fused programs (and their tolerance) are tests/runtime's — so its per-op replays are bitwise too.
"""
import os

import pytest

# The suite keeps both cores busy (one pytest-xdist worker each): a compile helper below the
# workers' priority (the default, NEURON_LAB_COMPILE_NICE=19: the idle policy) would get almost
# none of them, and the tests that wait for compiles would wait for the workers to pause.
# Nothing here times a loop.
os.environ.setdefault("NEURON_LAB_COMPILE_NICE", "0")

import neuron_lab
from neuron_lab.runtime import worker


def _settle(phase: str):
    """No background compile outlives the phase that queued it. A compile still loading when
    the next phase starts races pytest's log capture, which walks ``logging``'s logger dict
    without its lock while the compile's first imports add loggers to it ("dictionary changed
    size during iteration" at a later test's setup or teardown); it would also run beside the
    next test, whose results it must not touch."""
    try:
        return (yield)
    finally:
        if worker.pending() and not worker.wait(timeout=300):
            raise RuntimeError(f"a compile queued in {phase} was still running 300 s after it")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _settle("setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _settle("the test"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    return (yield from _settle("teardown"))


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

