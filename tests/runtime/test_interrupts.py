"""Ctrl-C at random points: every tensor already handed out keeps its value, accounting exact.

A helper thread sends a real SIGINT to the main thread after a random delay while it runs a
loop (the handler raises KeyboardInterrupt at the next bytecode boundary, as for Ctrl-C or
Jupyter's interrupt button), many times, at delays spread over the loop's duration. After each
interrupt: every tensor the loop had handed out equals its CPU value, the loop runs again
normally, and once everything is freed ``memory_allocated()`` is back at its starting value.
The loops run per-op (compiling off) and with fused programs (compiled in the foreground or by
the background worker; regions decided fused launched on the device's thread at
``Optimizer.step()``'s boundaries); deterministic sweeps raise SIGINT at every Python function
entry of the runtime and of the launch queue's waits.
"""
import gc
import random
import signal
import threading
import time

import pytest
import torch

import neuron_lab
from neuron_lab import runtime
from neuron_lab.device import memory
from neuron_lab.runtime import knobs
from neuron_lab.runtime.launch_queue import Job, LaunchQueue


@pytest.fixture(autouse=True)
def python_sigint():
    """Python's own SIGINT handler (it raises KeyboardInterrupt) in each test, as in a script or
    a notebook, whatever a library used before left installed; the previous one after."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


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


def _interrupted(loop, check, trials: int, seed: int) -> int:
    """Run ``loop(outs)`` once uninterrupted (its time is the span), then ``trials`` times with
    a SIGINT after a seeded random delay within the span, ``check``-ing the outputs each kept;
    returns how many runs the interrupt reached."""
    t0 = time.perf_counter()
    loop([])
    neuron_lab.sync()
    span = time.perf_counter() - t0
    rng = random.Random(seed)
    interrupted = 0
    for _ in range(trials):
        outs = []
        killer = _interrupt_after(rng.uniform(0, span))
        try:
            killer.start()
            loop(outs)
            killer.join()            # a late signal is raised here, still inside the try
        except KeyboardInterrupt:
            interrupted += 1
            killer.join()
        check(outs)
    return interrupted


def _settled_base() -> int:
    """The device memory a test's exact check starts from, once nothing left by earlier tests
    can change it mid-test: queued launches run, compiles in flight done (a compile job holds
    its region and example inputs until it ends), cyclic garbage collected."""
    neuron_lab.sync()
    runtime.wait_compiles()
    gc.collect()
    return memory.memory_allocated()


@pytest.mark.parametrize("mode", ["adaptive", "eager"])
def test_interrupts_keep_handed_out_values(compile_off, mode):
    expect = [_step(x) for x in _xs()]
    with neuron_lab.mode(mode):
        xs = [x.to("neuron") for x in _xs()]
        base = _settled_base()

        def check(outs):
            for j, out in outs:
                torch.testing.assert_close(out.cpu(), expect[j], rtol=0, atol=0)

        assert _interrupted(lambda outs: _loop(xs, outs, 32), check, 60, seed=0) >= 30
        after = []
        _loop(xs, after, 8)              # the runtime works normally afterwards
        check(after)
        del after
        neuron_lab.sync()
        gc.collect()
        assert memory.memory_allocated() == base
        assert memory.live_storages() == memory.memory_stats()["allocation.all.current"]


def test_uncount_survives_an_interrupt_at_the_free():
    """The memory accounting's weakref callback is where a storage's bytes are uncounted; an
    interrupt raised while a storage dies must not lose that uncount."""
    base = _settled_base()
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


def _chain(x, w, opt, outs, n):
    """The reviewer's loop: a 16x16 matmul/tanh/mean chain that keeps its outputs; a boundary
    nobody waits at every 3 steps (a fused region goes to the device's thread), a read every 6."""
    for i in range(n):
        x = torch.tanh(x @ w)
        m = x.mean()
        outs += [x, m]
        if i % 3 == 2:
            opt.step()
        if i % 6 == 5:
            m.item()


def _chain_cpu(x, w, n):
    outs = []
    for _ in range(n):
        x = torch.tanh(x @ w)
        outs += [x, x.mean()]
    return outs


@pytest.mark.parametrize("compiles", ["foreground", "background"])
def test_interrupts_keep_values_with_fused_programs_and_the_device_thread(compiles):
    """40 seeded random SIGINTs into the chain with compiles on and NEURON_LAB_ASYNC: every
    tensor handed out before the interrupt has its value, the engine goes on, and memory is
    back at its baseline once everything is freed. (Trials of fused against per-op are swept
    by ``test_interrupt_at_every_line_of_the_runtime[compiled]``.)"""
    g = torch.Generator().manual_seed(3)
    w_cpu, x_cpu = torch.randn(16, 16, generator=g) / 4, torch.randn(16, 16, generator=g)
    n = 12
    expect = _chain_cpu(x_cpu, w_cpu, n)
    # TRIALS 0: a compiled region runs fused for good, whatever the machine's load
    with knobs.COMPILE.scoped(True), knobs.ASYNC.scoped(True), knobs.TRIALS.scoped(0), \
            knobs.SYNC_COMPILE.scoped(compiles == "foreground"):
        w, x = w_cpu.to("neuron"), x_cpu.to("neuron")
        # no grads: only its step's hooks
        opt = torch.optim.SGD([torch.zeros(1, device="neuron")], lr=0.1)
        base = _settled_base()
        for _ in range(4):                   # the regions are learned, compiled and decided
            _chain(x, w, opt, [], n)
            neuron_lab.sync()
            runtime.wait_compiles()

        def check(outs):
            for j, out in enumerate(outs):
                torch.testing.assert_close(out.cpu(), expect[j], rtol=1e-5, atol=1e-6)

        assert _interrupted(lambda outs: _chain(x, w, opt, outs, n), check, 40, seed=42) >= 30
        stats = runtime.stats()
        assert stats["ops_fused"] > 0 and stats["device_thread_launches"] > 0
        after = []
        _chain(x, w, opt, after, n)          # the runtime works normally afterwards
        check(after)
        del after
        neuron_lab.sync()
        runtime.wait_compiles()
        gc.collect()
        assert memory.memory_allocated() == base


def test_a_deferred_interrupt_keeps_no_frame_of_the_launch_alive():
    """The KeyboardInterrupt a launch delivers at its end may be kept (a notebook keeps the last
    traceback): it must not keep the frame the signal arrived in, whose host tensors would then
    count in ``memory_allocated()`` after everything is freed."""
    import weakref
    from neuron_lab.runtime.interrupts import deferred_interrupts

    def launch():
        host = torch.ones(256)
        signal.raise_signal(signal.SIGINT)      # handled here, in this frame: deferred
        return weakref.ref(host)

    kept = None
    try:
        with deferred_interrupts():
            ref = launch()
    except KeyboardInterrupt as e:
        kept = e
    assert kept is not None and ref() is None


def test_an_interrupted_wait_for_the_launch_queue_leaves_its_lock_free():
    """SIGINT at each Python function entry while the host waits for a queued launch (``wait``,
    ``drain``, and ``submit`` with the queue full): the queue's lock is never left taken (the
    device's thread could not finish a job) nor released twice (a RuntimeError instead of the
    KeyboardInterrupt), and the queue runs on."""
    import sys
    main = threading.get_ident()
    q = LaunchQueue()
    ops = {"wait": q.wait, "drain": q.drain,
           "submit": lambda: q.submit(Job(lambda: None, []))}

    def run(op, n):
        gate = threading.Event()
        for _ in range(4 if op == "submit" else 1):    # submit: the queue is full (DEPTH)
            q.submit(Job(gate.wait, []))
        seen = 0

        def prof(frame, event, arg):
            nonlocal seen
            if event == "call" and threading.get_ident() == main:
                seen += 1
                if seen == n:
                    signal.raise_signal(signal.SIGINT)

        opener = threading.Timer(0.02, gate.set)   # the job ends a little later, whatever
        opener.start()                              # the host is doing then
        sys.setprofile(prof)
        try:
            ops[op]()
        except KeyboardInterrupt:
            pass
        finally:
            sys.setprofile(None)
        opener.join()
        q.wait()
        assert not q.busy() and not q._lock.locked()
        return seen

    for op in ops:
        total = run(op, 0)
        for n in range(1, total + 1):
            run(op, n)


@pytest.mark.parametrize("compiles", [False, True], ids=["compile-off", "compiled"])
def test_interrupt_at_every_line_of_the_runtime(compiles):
    """Deterministic sweep: a SIGINT raised at the n-th Python function entry in neuron_lab's
    code during a deferred loop, for n over all of them (every ``step``-th when there are many).
    Function entry is where CPython runs a pending signal's handler (besides after calls and at
    loop back-edges), so KeyboardInterrupt is raised right there unless a launch defers it.
    (Raising from a profiler's return events would also hit points CPython never interrupts,
    such as between a lock's ``__enter__`` and its ``with`` block, and leak the lock.)
    Values and accounting stay exact. Compiled: the sweep's first loops capture, compile (in the
    foreground) and trial the region, the later ones run it fused."""
    with knobs.COMPILE.scoped(compiles):
        _sweep(warm=not compiles, tol=dict(rtol=1e-5, atol=1e-6) if compiles else
               dict(rtol=0, atol=0))


def _sweep(warm: bool, tol: dict) -> None:
    import os
    import sys
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(neuron_lab.__file__)))
    pkg = os.path.join(pkg, "neuron_lab") + os.sep
    expect = [_step(x) for x in _xs()]
    xs = [x.to("neuron") for x in _xs()]
    base = _settled_base()
    if warm:
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
            torch.testing.assert_close(out.cpu(), expect[j], **tol)
        return seen, hit

    total, _ = run(0)
    step = max(1, total // 150)
    hits = sum(run(n)[1] for n in range(1, total + 1, step))
    assert hits >= len(range(1, total + 1, step)) // 2
    neuron_lab.sync()
    gc.collect()
    assert memory.memory_allocated() == base
