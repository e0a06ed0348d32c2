"""The background compile worker: one daemon thread that compiles regions off the hot path.

A launch never waits for a compile: until ``region.program`` is set the region runs per-op.
A failure marks the region per-op for good and records the error (results never change).
``NEURON_LAB_SYNC_COMPILE=1`` compiles in the caller's thread (deterministic tests).
"""
from __future__ import annotations

import atexit
import queue
import threading
import time
import traceback

import torch

from ..device import events
from . import compiler, knobs

_q: queue.Queue = queue.Queue()
_thread: threading.Thread | None = None
_lock = threading.Lock()
state = {"queued": 0, "running": 0, "done": 0, "failed": 0, "seconds": 0.0}


def _compile(region, gm, examples, stats, largest=0) -> None:
    t0 = time.perf_counter()
    region.status = "compiling"
    state["running"] += 1
    events.emit(events.COMPILE, region=region.id, seconds=0.0, outcome="running", error=None)
    try:
        with torch.profiler.record_function(f"neuron::compile[region {region.id}]"):
            program = compiler.compile_program(gm, examples, largest)
    except Exception as e:  # noqa: BLE001 - any compiler error means: stay per-op
        region.status, region.error = "failed", f"{type(e).__name__}: {e}"[:500]
        region.compile_s = time.perf_counter() - t0
        state["failed"] += 1
        stats["compiles_failed"] += 1
        if knobs.DEBUG_LEVEL() > 1:
            traceback.print_exc()
        events.emit(events.COMPILE, region=region.id, seconds=region.compile_s, outcome="failed",
                    error=region.error)
    else:
        region.compile_s = time.perf_counter() - t0
        region.program = program
        region.status = "trial"
        state["done"] += 1
        stats["compiles_done"] += 1
        events.emit(events.COMPILE, region=region.id, seconds=region.compile_s, outcome="ok",
                    error=None)
    finally:
        state["running"] -= 1
        state["queued"] -= 1
        state["seconds"] += time.perf_counter() - t0


def _loop() -> None:
    while True:
        job = _q.get()
        if job is None:
            return
        _compile(*job)
        _q.task_done()


def submit(region, gm, examples, stats, largest: int = 0) -> None:
    global _thread
    state["queued"] += 1
    stats["compiles_queued"] += 1
    events.emit(events.COMPILE, region=region.id, seconds=0.0, outcome="queued", error=None)
    if knobs.SYNC_COMPILE.get():
        _compile(region, gm, examples, stats, largest)
        return
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_loop, name="neuron_lab-compile", daemon=True)
            _thread.start()
    _q.put((region, gm, examples, stats, largest))


def shutdown(timeout: float = 120.0) -> None:
    """Let a running compile finish and stop the thread (at interpreter exit: a daemon thread
    killed inside C++ compiler code can abort the process)."""
    t = _thread
    if t is not None and t.is_alive():
        _q.put(None)
        t.join(timeout)


atexit.register(shutdown)


def pending() -> int:
    return state["queued"]


def wait(timeout: float | None = None) -> bool:
    """Block until every queued compile finished (tests, benchmarks); True if drained."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while state["queued"] > 0:
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
