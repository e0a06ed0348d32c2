"""The background compile worker: one daemon thread that compiles regions off the hot path.

A launch never waits for a compile: until ``region.program`` is set the region runs per-op.
A failure marks the region per-op for good and records the error (results never change).
``NEURON_LAB_SYNC_COMPILE=1`` makes the caller wait for each compile (deterministic tests).

Sharing the GIL. A compile is seconds of Python (AOTAutograd tracing, inductor's lowering) that
holds the GIL; every op the user's thread issues releases the GIL inside PyTorch's bindings and
then waits for the compile thread to hand it back, up to the interpreter's switch interval
(5 ms). While a compile runs, the worker lowers the switch interval to
``NEURON_LAB_COMPILE_SWITCH_US`` (restored when the queue is empty), so the user's thread waits
at most that long per op. The compile keeps full speed when the user's thread is idle, and
takes as long at a 50 us interval as at 5 ms, while a cell run during it waits far less.

The compile itself runs in a helper process (``helper.py``, ``NEURON_LAB_COMPILE_HELPER``): the
worker thread waits for it with the GIL released, then compiles the same graph here, which
loads the program from the caches the helper wrote: the seconds of GIL-holding Python a
compile is never run beside the user's loop. What is left in the user's process is the load,
and the first program loaded in a process sets inductor up (its imports: seconds of Python).

Bounds. At most ``NEURON_LAB_COMPILE_QUEUE`` (32) regions wait; a hot region found while the
queue is full stays ``recorded`` and is queued at a later launch. A region evicted from the
region cache while it waits is dropped from the queue (outcome ``dropped``), never compiled.

Exit. At interpreter exit (``shutdown``, an atexit handler) nothing new is queued, every queued
compile is dropped, and a compile already running gets ``NEURON_LAB_EXIT_WAIT_S`` (2 s) to
finish; then it is cancelled: ``_Cancelled`` is raised asynchronously in the worker thread
(``PyThreadState_SetAsyncExc``), which lands at its next Python bytecode (compiling is mostly
Python; inside the C++ compiler's subprocess wait it lands when that returns), and the thread
is joined. Without this, a script that formed ~150 regions took 94 s to exit after its last
line, each queued compile failing with "can't register atexit after shutdown".
"""
from __future__ import annotations

import atexit
import ctypes
import queue
import sys
import threading
import time
import traceback
import weakref

import torch
from torch import fx

from ..device import events
from . import helper, knobs, programs
from .status import Status

_q: queue.Queue = queue.Queue()
_thread: threading.Thread | None = None
_lock = threading.Lock()
state = {"queued": 0, "running": 0, "done": 0, "failed": 0, "dropped": 0, "cancelled": 0,
         "seconds": 0.0, "waiting_idle": 0, "idle_wait_s": 0.0}
_closing = False
_last_activity = 0.0    # time.monotonic() of the last segment end or launch (``note_activity``)
_watched = None         # a weak reference to the installed engine (``watch``)
_waiters = 0            # threads in ``wait``: the user waits for the compiles, a pause


class _Cancelled(BaseException):
    """Raised in the worker thread at exit to stop a running compile (not an Exception: the
    compiler's own ``except Exception`` handlers must not swallow it)."""


def _compile(region, graph, examples, stats, build=programs.Build(), floats=(None, None)) -> None:
    t0 = time.perf_counter()
    region.move(Status.COMPILING)
    _add("running", 1)
    events.emit(events.COMPILE, region=region.id, seconds=0.0, outcome="running", error=None)
    try:
        program = _compiled(region, fx.GraphModule(torch.nn.Module(), graph), examples, build,
                            floats)
    except _Cancelled:
        region.move(Status.RECORDED)
        _add("cancelled", 1)
        raise
    except Exception as e:  # noqa: BLE001 - any compiler error means: stay per-op
        region.move(Status.FAILED, f"{type(e).__name__}: {e}")
        region.compile_s = time.perf_counter() - t0
        _add("failed", 1)
        _add("compiles_failed", 1, stats)
        if knobs.DEBUG_LEVEL() > 1:
            traceback.print_exc()
        events.emit(events.COMPILE, region=region.id, seconds=region.compile_s, outcome="failed",
                    error=region.error)
    else:
        region.compile_s = time.perf_counter() - t0
        region.program = program
        region.move(Status.TRIAL)
        _add("done", 1)
        _add("compiles_done", 1, stats)
        events.emit(events.COMPILE, region=region.id, seconds=region.compile_s, outcome="ok",
                    error=None)
    finally:
        _add("running", -1)
        _add("seconds", time.perf_counter() - t0)


def _compiled(region, gm, examples, build, floats):
    """The region's program. With the compile helper (``helper.py``; background compiles only)
    the helper compiles first, outside dynamo's lock, and the compile here loads its result
    from inductor's caches; after a helper error it compiles here from scratch (the reference).
    A compile past its time limit raises ``helper.CompileTimeout`` (the region fails)."""
    fixed, fallback = floats
    packed = None
    background = not knobs.SYNC_COMPILE.get()
    if knobs.COMPILE_HELPER.get() and background:
        reply = helper.ask(gm, examples, build, fixed, fallback)
        if _closing:                 # shutdown stopped the helper: do not compile here instead
            raise _Cancelled
        if reply is not None and reply.ok:
            packed = reply.specialized_on is None
    if background:
        _wait_for_idle()
    with _compile_lock(), torch.profiler.record_function(f"neuron::compile[region {region.id}]"):
        return programs.compile_program(gm, examples, build, fixed, fallback, packed)


def note_activity() -> None:
    """The engine ended a segment, or started or finished a launch: the device is in use."""
    global _last_activity
    _last_activity = time.monotonic()


def watch(engine) -> None:
    """The installed engine (``installation.install``): while it is at work (``engine.active()``:
    ops queued, a launch running) it is in use however long ago a segment ended. A step whose
    ops take longer to issue than ``NEURON_LAB_COMPILE_LOAD_IDLE_MS``, or a launch that runs
    longer, is no pause. Held weakly."""
    global _watched
    _watched = weakref.ref(engine)


def _engine_active() -> bool:
    """Is the installed engine at work, and nobody waiting for the compiles?"""
    w = _watched
    e = w() if w is not None else None
    return e is not None and e.active() and not _waiters


def _wait_for_idle() -> None:
    """Hold the in-process part of a background compile until the engine has ended no segment
    for ``NEURON_LAB_COMPILE_LOAD_IDLE_MS`` (20 ms) and is not at work (``watch``; a thread in
    ``wait`` is the pause), or ``NEURON_LAB_COMPILE_LOAD_WAIT_S`` (1 s) at most. That part
    holds the GIL: with the helper it is the load from inductor's caches (AOTAutograd's cache
    key, fake inputs, the program's modules: 35-70 ms of CPU for an MLP train step's region),
    without it the whole compile. Run beside the user's loop it adds its CPU to the loop's on
    one core and takes turns at the GIL with it on more: a notebook cell re-run whose regions
    reach ``NEURON_LAB_COMPILE_AFTER`` during the run took 64-80 ms on one core against 25 ms
    per-op without the load. Waiting moves it into the pause after the cell;
    a loop that never pauses gets its programs at most the wait later."""
    idle = knobs.COMPILE_LOAD_IDLE_MS.get() / 1e3
    if idle <= 0:
        return
    t0 = time.monotonic()
    deadline = t0 + knobs.COMPILE_LOAD_WAIT_S.get()
    waited = False
    try:
        while not _closing:
            now = time.monotonic()
            quiet = now - _last_activity
            if (quiet >= idle and not _engine_active()) or now >= deadline:
                return
            if not waited:
                waited = True
                _add("waiting_idle", 1)
            time.sleep(min(max(idle - quiet, idle / 4), deadline - now))
    finally:
        if waited:
            _add("waiting_idle", -1)
            _add("idle_wait_s", time.monotonic() - t0)


def _compile_lock():
    """Dynamo's own lock around every compile in the process. PyTorch's compile stack keeps
    process-wide state (``torch.fx.traceback.current_meta`` and ``should_preserve_node_meta``,
    dynamo's counters and code caches): a region compiling here while the user's thread runs
    ``torch.compile`` (or ``torch._dynamo.reset()``) corrupted both — in the test suite an
    AOTAutograd backward trace on the main thread failed "Expected current_level > 0" and
    "dictionary changed size during iteration" was raised outside the test's thread
    (tests/runtime/test_threads.py reproduces it). Dynamo serialises its frame compiles with
    this lock; taking it makes a region compile one more of them. The user's loop never waits
    for it: only another compile does."""
    from torch._dynamo.convert_frame import compile_lock
    return compile_lock


def _add(key: str, n, d: dict | None = None) -> None:
    """Counters written by the compile thread and the user's threads: ``x += n`` on a dict is a
    read-modify-write the interpreter can switch threads in (a lost ``queued`` decrement would
    make ``wait()`` block forever)."""
    d = state if d is None else d
    with _lock:
        d[key] = d.get(key, 0) + n


def _loop() -> None:
    default = sys.getswitchinterval()
    try:
        while True:
            job = _q.get()
            if job is None:
                return
            if _closing or job[0].status is not Status.QUEUED:     # evicted (or reset) while waiting
                _drop(job[0])
                continue
            us = knobs.COMPILE_SWITCH_US.get()
            if us > 0:
                sys.setswitchinterval(min(default, us / 1e6))
            try:
                _compile(*job)
            finally:
                job = None          # the region, its graph and example inputs go before a
                _add("queued", -1)  # ``wait`` hears that the compile is done
                if _q.empty():
                    sys.setswitchinterval(default)
    except _Cancelled:
        return
    finally:
        sys.setswitchinterval(default)


def _drop(region) -> None:
    _add("queued", -1)
    _add("dropped", 1)
    if region.status is Status.QUEUED:
        region.move(Status.RECORDED)
    events.emit(events.COMPILE, region=region.id, seconds=0.0, outcome="dropped", error=None)


def has_room() -> bool:
    """May another region be queued? (The policy asks before building its graph.)"""
    return not _closing and state["queued"] < knobs.COMPILE_QUEUE.get()


def submit(region, graph, examples, stats, build=programs.Build(), floats=(None, None)) -> None:
    """Compile ``graph`` (an ``fx.Graph``, made a GraphModule on the compile thread) for
    ``region`` in the background; ``build`` (a ``programs.Build``) and ``floats`` ((fixed,
    fallback)) as ``programs.compile_program`` takes them."""
    global _thread
    if _closing:
        region.move(Status.RECORDED)
        return
    _add("queued", 1)
    _add("compiles_queued", 1, stats)
    events.emit(events.COMPILE, region=region.id, seconds=0.0, outcome="queued", error=None)
    if knobs.SYNC_COMPILE.get():
        # In a thread of its own, joined: a launch can happen inside a device kernel (a boundary
        # op flushes the queue), whose dispatch state (the Python key excluded, as in every
        # kernel) a compile must not inherit: FakeTensorMode refuses to start under it.
        t = threading.Thread(target=_compile, args=(region, graph, examples, stats, build, floats),
                             name="neuron_lab-compile-sync")
        t.start()
        try:
            t.join()
        finally:
            _add("queued", -1)
        return
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_loop, name="neuron_lab-compile", daemon=True)
            _thread.start()
    _q.put((region, graph, examples, stats, build, floats))


def shutdown(wait_s: float | None = None) -> None:
    """Drop queued compiles, give a running one ``wait_s`` (``NEURON_LAB_EXIT_WAIT_S``) to finish,
    then cancel it and stop the thread (see the module header). The thread is joined rather than
    left to die as a daemon: one killed inside C++ compiler code can abort the process."""
    global _closing
    _closing = True
    while True:
        try:
            job = _q.get_nowait()
        except queue.Empty:
            break
        if job is not None:
            _drop(job[0])
    helper.stop()            # a compile waiting for the helper gets EOF and is not retried
    t = _thread
    if t is None or not t.is_alive():
        return
    _q.put(None)
    t.join(knobs.EXIT_WAIT_S.get() if wait_s is None else wait_s)
    if t.is_alive() and t.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident),
                                                   ctypes.py_object(_Cancelled))
        t.join(5.0)


atexit.register(shutdown)


def pending() -> int:
    return state["queued"]


def wait(timeout: float | None = None) -> bool:
    """Block until every queued compile finished (tests, benchmarks); True if drained."""
    global _waiters
    deadline = None if timeout is None else time.monotonic() + timeout
    with _lock:
        _waiters += 1
    try:
        while state["queued"] > 0:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True
    finally:
        with _lock:
            _waiters -= 1
