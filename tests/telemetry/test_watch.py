"""The idle change watcher: listeners run when the device state moved, not otherwise, and
not while paused (a cell is running and the sampler pushes instead)."""
import time

import torch

import neuron_lab  # noqa: F401
from neuron_lab.telemetry import ChangeWatcher
from neuron_lab.telemetry.watch import signature


def test_check_fires_only_on_change():
    w = ChangeWatcher()
    w.resume()                                  # baseline now
    calls = []
    w.listeners.append(lambda: calls.append(1))
    assert not w.check() and calls == []
    x = torch.empty(4096, device="neuron")
    assert w.check() and calls == [1]
    assert not w.check()                        # the same state again: silent
    torch.ones(2, device="neuron", dtype=torch.float64).sum()   # a fallback moves it too
    assert w.check() and len(calls) == 2
    del x


def test_thread_reports_idle_allocations_and_respects_pause():
    w = ChangeWatcher(hz=20)
    calls = []
    w.listeners.append(lambda: calls.append(signature()[0]))
    w.start()
    try:
        time.sleep(0.2)
        assert calls == []                      # nothing moved
        x = torch.empty(1 << 14, device="neuron")
        deadline = time.time() + 3
        while not calls and time.time() < deadline:
            time.sleep(0.02)
        assert calls and calls[-1] >= 4 << 14
        w.pause()
        n = len(calls)
        y = torch.empty(1 << 14, device="neuron")
        time.sleep(0.3)
        assert len(calls) == n                  # paused: the sampler's job
        w.resume()                              # resume takes the new state as the baseline
        time.sleep(0.3)
        assert len(calls) == n
    finally:
        w.stop()
    assert not w.alive
    del x, y
