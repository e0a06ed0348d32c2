"""A background compile's part in the user's process waits for the engine to pause.

That part (the load from inductor's caches after the helper; the whole compile without it)
holds the GIL, so it runs once the engine has ended no segment for
``NEURON_LAB_COMPILE_LOAD_IDLE_MS`` and is not at work, or after ``NEURON_LAB_COMPILE_LOAD_WAIT_S``
at most (runtime/worker.py, ``_wait_for_idle``).
"""
import contextlib
import threading
import time

import torch

from neuron_lab import runtime
from neuron_lab.runtime import knobs, programs, worker


def _step(x):
    return (torch.tanh(x * 1.5) + 0.25).sum().item()


def _until(cond, timeout=120.0, during=None):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        if during is not None:
            during()
        else:
            time.sleep(0.005)


def _calls(monkeypatch) -> list:
    """When ``programs.compile_program`` (the in-process part) is entered, from now on."""
    calls = []
    real = programs.compile_program

    def compile_program(*a, **k):
        calls.append(time.monotonic())
        return real(*a, **k)
    monkeypatch.setattr(programs, "compile_program", compile_program)
    return calls


@contextlib.contextmanager
def _background_compiles(idle_ms: float, wait_s: float):
    """Every region compiled after its first run, in the worker thread (no helper), its
    in-process part held for ``idle_ms`` of pause, ``wait_s`` at most."""
    with knobs.COMPILE.scoped(True), knobs.COMPILE_AFTER.scoped(1), \
            knobs.COMPILE_HELPER.scoped(False), knobs.SYNC_COMPILE.scoped(False), \
            knobs.COMPILE_LOAD_IDLE_MS.scoped(idle_ms), knobs.COMPILE_LOAD_WAIT_S.scoped(wait_s):
        yield


def test_the_in_process_compile_waits_until_the_loop_pauses(fresh_engine, monkeypatch):
    calls = _calls(monkeypatch)
    x_cpu = torch.randn(256)
    x = x_cpu.to("neuron")
    want = _step(x_cpu)
    with _background_compiles(idle_ms=1000.0, wait_s=600.0):
        wait_s = worker.state["idle_wait_s"]
        # the loop runs until the compile is queued and held at the gate, then 0.5 s more
        _until(lambda: worker.state["waiting_idle"] == 1, during=lambda: _step(x))
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            assert abs(_step(x) - want) <= 1e-4 * abs(want) + 1e-5
        stopped = time.monotonic()
        assert not calls                         # held while the loop ran
        runtime.wait_compiles()                  # the loop pauses here: the compile goes on
    assert len(calls) == 1 and calls[0] - stopped >= 0.5
    assert worker.state["waiting_idle"] == 0
    assert worker.state["idle_wait_s"] - wait_s >= 1.2
    assert any(r["status"] in ("trial", "fused") for r in runtime.regions())


def _slow_step(x):
    """A step whose host work (50 ms) comes between its ops: its segment stays open meanwhile."""
    y = torch.tanh(x * 1.5)
    time.sleep(0.05)
    return (y + 0.25).sum().item()


def test_a_step_that_issues_for_longer_than_the_idle_time_is_no_pause(fresh_engine, monkeypatch):
    """The step ends no segment for longer than ``NEURON_LAB_COMPILE_LOAD_IDLE_MS``, but its
    ops are queued all the while (``Engine.active``): the load waits until the loop pauses, as
    for a loop of short steps (a tiny GPT's forward and backward issue one segment for ~30 ms,
    and loads that started inside it took its steps from 30 ms to 200-500 ms)."""
    calls = _calls(monkeypatch)
    x_cpu = torch.randn(256)
    x = x_cpu.to("neuron")
    want = _slow_step(x_cpu)
    with _background_compiles(idle_ms=20.0, wait_s=600.0):
        _until(lambda: worker.state["waiting_idle"] == 1 or calls, during=lambda: _slow_step(x))
        assert not calls                         # not loaded inside a step
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            assert abs(_slow_step(x) - want) <= 1e-4 * abs(want) + 1e-5
        assert not calls                         # held while the steps issued their ops
        runtime.wait_compiles()                  # the loop pauses here: the compile goes on
    assert len(calls) == 1
    assert any(r["status"] in ("trial", "fused") for r in runtime.regions())


def test_waiting_for_the_compiles_is_a_pause_with_ops_still_queued(fresh_engine, monkeypatch):
    """``runtime.wait_compiles()`` with a segment left open (its ops queued, nothing read):
    the thread that waits is the pause, so the load does not wait for the engine to end it."""
    calls = _calls(monkeypatch)
    x_cpu = torch.randn(256)
    x = x_cpu.to("neuron")
    with _background_compiles(idle_ms=1000.0, wait_s=30.0):
        _until(lambda: worker.state["waiting_idle"] == 1, during=lambda: _step(x))
        y = torch.tanh(x * 1.5)              # deferred along the known region: left queued
        assert runtime.current().engine.active()
        assert runtime.wait_compiles(timeout=10.0)   # not the 30 s bound
    assert len(calls) == 1
    assert torch.equal(y.cpu(), torch.tanh(x_cpu * 1.5))


def test_a_loop_that_never_pauses_gets_its_program_after_the_longest_wait(fresh_engine,
                                                                           monkeypatch):
    calls = _calls(monkeypatch)
    x = torch.randn(256).to("neuron")
    with _background_compiles(idle_ms=1000.0, wait_s=0.3):
        held = []
        _until(lambda: worker.state["waiting_idle"] == 1, during=lambda: _step(x))
        t0 = time.monotonic()
        _until(lambda: calls, timeout=60.0, during=lambda: held.append(_step(x)))
        assert held                              # the loop kept running: no pause came
        runtime.wait_compiles()


def test_a_zero_idle_time_loads_at_once(fresh_engine):
    worker.note_activity()
    with knobs.COMPILE_LOAD_IDLE_MS.scoped(0.0):
        t = threading.Thread(target=worker._wait_for_idle)
        t.start()
        t.join(5.0)
        assert not t.is_alive()
