"""A region compiling in the background while the user's thread runs ``torch.compile``.

PyTorch's compile stack keeps process-wide state: ``torch.fx.traceback.preserve_node_meta``
(entered and left many times by every AOTAutograd trace) saves and restores the global
``current_meta``, which AOTAutograd's backward-tracing hooks count in. Two compiles at once
corrupt each other: in the test suite, with a region compiling in the background, the user's
``torch.compile(backend="aot_eager")`` training step failed "Expected current_level > 0, got 0"
(and a "dictionary changed size during iteration" was raised outside the test's thread — the
race a suite-wide fixture used to hide by waiting for compiles between tests). The worker takes
dynamo's compile lock, so compiles take turns. Here the background compile is the real one,
preceded by the node-meta save/restore cycles an AOTAutograd trace performs, kept running
while the main thread traces a long backward, so the race is hit every run without the lock.
"""
import sys
import threading
import time

import torch

from neuron_lab import runtime
from neuron_lab.runtime import knobs, programs


def _long(a):
    for _ in range(60):
        a = torch.sin(a) * 1.01
    return a.sum()


def test_background_compile_and_torch_compile_take_turns(fresh_engine, monkeypatch):
    import torch._dynamo
    import torch.fx.traceback as fx_traceback

    real = programs.compile_program
    started, done, finished = threading.Event(), threading.Event(), threading.Event()

    def compile_program(*a, **k):
        started.set()
        i, end = 0, time.monotonic() + 4.0
        while not done.is_set() and time.monotonic() < end:   # the main thread compiles meanwhile
            with fx_traceback.preserve_node_meta():
                fx_traceback.current_meta["seq_nr"] = i
            i += 1
        finished.set()
        return real(*a, **k)

    monkeypatch.setattr(programs, "compile_program", compile_program)
    x = torch.randn(33, 17).to("neuron")
    old = sys.getswitchinterval()
    with knobs.SYNC_COMPILE.scoped(False), knobs.TRIALS.scoped(0):
        for _ in range(3):
            y = x
            for _ in range(4):
                y = torch.cos(y) * 1.25 + 0.5
            y.sum().item()
        assert started.wait(60)
        sys.setswitchinterval(1e-6)
        try:
            while not done.is_set() and not finished.is_set():
                torch._dynamo.reset()
                a = torch.randn(8, 8, requires_grad=True)
                torch.compile(_long, backend="aot_eager")(a).backward()
                torch.testing.assert_close(a.grad, torch.func.grad(_long)(a.detach()))
        finally:
            done.set()
            sys.setswitchinterval(old)
        assert runtime.wait_compiles(timeout=300)
    assert all(r["status"] != "failed" for r in runtime.regions()), runtime.regions()
