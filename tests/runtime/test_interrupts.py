"""Ctrl-C at random points: every tensor already handed out keeps its value, accounting exact.

A helper thread sends a real SIGINT to the main thread after a random delay while it runs a
loop (the handler raises KeyboardInterrupt at the next bytecode boundary, as for Ctrl-C or
Jupyter's interrupt button), many times, at delays spread over the loop's duration. After each
interrupt: every tensor the loop had handed out equals its CPU value, the loop runs again
normally, and once everything is freed ``memory_allocated()`` is back at its starting value.
"""
import gc
import random
import signal
import threading
import time

import pytest
import torch

import neuron_lab
from neuron_lab.device import memory


def _xs():
    g = torch.Generator().manual_seed(7)
    return [torch.randn(16, 16, generator=g) for _ in range(4)]


def _step(x):
    y = x * 1.5
    y = torch.tanh(y) + x
    return (y @ x).relu()


def _loop(xs, outs, n):
    for i in range(n):
        y = _step(xs[i % 4])
        outs.append((i % 4, y))
        if i % 4 == 3:
            y.sum().item()          # a sync point: the regions end here


def _interrupt_after(delay):
    main = threading.main_thread().ident
    t = threading.Timer(delay, lambda: signal.pthread_kill(main, signal.SIGINT))
    t.daemon = True
    return t


@pytest.mark.parametrize("mode", ["adaptive", "eager"])
def test_interrupts_keep_handed_out_values(compile_off, mode):
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's default handler here")
    expect = [_step(x) for x in _xs()]
    with neuron_lab.mode(mode):
        xs = [x.to("neuron") for x in _xs()]
        neuron_lab.sync()
        gc.collect()                     # earlier tests' cyclic garbage must not die mid-test
        base = memory.memory_allocated()
        t0 = time.perf_counter()
        _loop(xs, [], 32)                # warm: the regions are known, later loops defer
        neuron_lab.sync()
        span = time.perf_counter() - t0
        rng = random.Random(0)
        interrupted = 0
        for trial in range(60):
            outs = []
            killer = _interrupt_after(rng.uniform(0, span))
            try:
                killer.start()
                _loop(xs, outs, 32)
                killer.join()            # a late signal is raised here, still inside the try
            except KeyboardInterrupt:
                interrupted += 1
                killer.join()
            for j, out in outs:
                torch.testing.assert_close(out.cpu(), expect[j], rtol=0, atol=0)
            outs = out = None
        assert interrupted >= 30
        after = []
        _loop(xs, after, 8)              # the runtime works normally afterwards
        for j, out in after:
            torch.testing.assert_close(out.cpu(), expect[j], rtol=0, atol=0)
        del after, out
        neuron_lab.sync()
        gc.collect()
        assert memory.memory_allocated() == base
        assert memory.live_storages() == memory.memory_stats()["allocation.all.current"]


def test_uncount_survives_an_interrupt_at_the_free():
    """The memory accounting's weakref callback is where a storage's bytes are uncounted; an
    interrupt raised while a storage dies must not lose that uncount."""
    neuron_lab.sync()
    gc.collect()                         # earlier tests' cyclic garbage must not die mid-test
    base = memory.memory_allocated()
    hit = 0

    def raise_on_free(frame, event, arg):     # a KeyboardInterrupt at the first Python line
        nonlocal hit                            # that runs while a neuron storage dies
        if event == "call" and "memory.py" in frame.f_code.co_filename and hit == 0:
            hit += 1
            raise KeyboardInterrupt
        return None

    with neuron_lab.mode("eager"):
        ts = [torch.ones(64, device="neuron") for _ in range(8)]
        assert memory.memory_allocated() == base + 8 * 256
        import sys
        sys.setprofile(raise_on_free)
        try:
            del ts                                # every storage dies here
        except KeyboardInterrupt:
            pass
        finally:
            sys.setprofile(None)
    gc.collect()
    assert memory.memory_allocated() == base
    x = torch.ones(64, device="neuron")          # a new storage, maybe at a freed one's id
    assert memory.memory_allocated() == base + 256
    del x
    assert memory.memory_allocated() == base


def test_interrupt_at_every_line_of_the_runtime(compile_off):
    """Deterministic sweep: a SIGINT raised at the n-th Python function entry in neuron_lab's
    code during a deferred loop, for n over all of them (every ``step``-th when there are many).
    Function entry is where CPython runs a pending signal's handler (besides after calls and at
    loop back-edges), so KeyboardInterrupt is raised right there unless a launch defers it.
    (Raising from a profiler's return events would also hit points CPython never interrupts,
    such as between a lock's ``__enter__`` and its ``with`` block, and leak the lock.)
    Values and accounting stay exact."""
    import os
    import sys
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's default handler here")
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(neuron_lab.__file__)))
    pkg = os.path.join(pkg, "neuron_lab") + os.sep
    expect = [_step(x) for x in _xs()]
    xs = [x.to("neuron") for x in _xs()]
    neuron_lab.sync()
    base = memory.memory_allocated()
    _loop(xs, [], 8)
    neuron_lab.sync()

    def run(n):
        seen = 0

        def prof(frame, event, arg):
            nonlocal seen
            if event == "call" and frame.f_code.co_filename.startswith(pkg):
                seen += 1
                if seen == n:
                    signal.raise_signal(signal.SIGINT)

        outs = []
        sys.setprofile(prof)
        try:
            _loop(xs, outs, 4)
            hit = False
        except KeyboardInterrupt:
            hit = True
        finally:
            sys.setprofile(None)
        for j, out in outs:
            torch.testing.assert_close(out.cpu(), expect[j], rtol=0, atol=0)
        return seen, hit

    total, _ = run(0)
    step = max(1, total // 150)
    hits = sum(run(n)[1] for n in range(1, total + 1, step))
    assert hits >= len(range(1, total + 1, step)) // 2
    neuron_lab.sync()
    gc.collect()
    assert memory.memory_allocated() == base
