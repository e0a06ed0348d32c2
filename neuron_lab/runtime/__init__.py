"""Layer 2, execution: the per-op (``eager``) path and the adaptive path.

``set_mode("adaptive" | "eager")`` (env ``NEURON_LAB_MODE``; default adaptive), ``mode(...)``
scoped, ``sync(reason)`` flushes queued work. Stages, one module each: ``record`` (the queued
op and its key), ``adaptive`` (queue, region formation, deferral), ``period`` (the
repeated-suffix rule that cuts long segments), ``cache`` (region trie, LRU), ``compiler``
(records -> FX graph), ``programs`` (FX graph -> inductor program), ``worker`` (background
compiles) and ``helper`` (the process they run in), ``policy`` (what to compile, fused or
per-op), ``status`` (a region's states and transitions), ``replay`` (per-op launch), ``fused``
(fused launch), ``pending`` (giving pending outputs their values), ``blame`` (a deferred op's
error named by its user's line). The eager path is the device's own ``kernels.execute``; the
engine plugs into the device through ``device.seam``.
"""
from __future__ import annotations

import atexit
import contextlib
import os

import torch.optim.optimizer as _optim

from . import knobs as _knobs

# Before anything imports inductor: its compiled programs persist under NEURON_LAB_CACHE_DIR,
# so a kernel restart or a second run of a script reuses them (cold compile ~10-20 s on CPU).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_knobs.CACHE_DIR.get(), "inductor"))

from ..device import seam
from ..device.config import ConfigError
from ..device.executor import synchronize as _executor_sync
from . import fastpath, knobs, worker
from .adaptive import Engine

MODES = ("eager", "adaptive")
engine = Engine()


# the device's one call-out (launch, flush, materialize, pending_bytes); launch's hot path in C
seam.install(fastpath.seam_runtime(engine))


def _follow_mode() -> None:
    """In eager mode with nothing queued the device runs direct ops itself (``seam.direct``:
    in C++, without calling the engine); adaptive mode sends every op to the engine. An eager
    op that finds ops still queued (the mode set without ``set_mode``'s flush) reaches
    ``Engine.launch``, which flushes them and turns the switch on."""
    try:
        eager = knobs.MODE.get() == "eager"
    except ConfigError:         # a bad NEURON_LAB_MODE: raised where the mode is read
        eager = False
    if eager:
        engine.queue.wait()     # the device's C++ kernels run eager ops after queued launches
    seam.run_directly(eager and not engine.records)


knobs.MODE.watch(_follow_mode)
_follow_mode()
atexit.register(lambda: engine.flush("exit"))   # a script's last ops run before it exits


def _optimizer_step_boundary(*_):
    """``Optimizer.step()`` starts and ends a region (PyTorch's global step hooks): the
    optimizer update is one region and forward+backward another (with
    ``NEURON_LAB_BACKWARD_BOUNDARY``, a backward pass's start ends the forward's: the device's
    ``seam.boundary``), from a training loop's second step on, with no sync and no
    ``mark_step()``; a re-run notebook cell finds the steps its first run cached, although that
    run's first step also created the optimizer's state."""
    engine.boundary("optimizer-step")


_optim.register_optimizer_step_pre_hook(_optimizer_step_boundary)
_optim.register_optimizer_step_post_hook(_optimizer_step_boundary)


def get_mode() -> str:
    return knobs.MODE.get()


def set_mode(m: str) -> None:
    engine.flush("mode")
    knobs.MODE.set(m)


@contextlib.contextmanager
def mode(m: str):
    engine.flush("mode")
    with knobs.MODE.scoped(m):
        try:
            yield m
        finally:
            engine.flush("mode")


def sync(reason: str = "synchronize") -> None:
    """Flush queued work: every pending value is computed when this returns."""
    from ..device import tracking
    engine.flush(reason)
    tracking.record_sync(reason)
    _executor_sync()


def wait_compiles(timeout: float | None = None) -> bool:
    """Block until background compiles finish (benchmarks and tests; user code never needs to).
    Launches still queued on the device's thread run first: a launch may queue a compile."""
    engine.queue.wait()
    return worker.wait(timeout)


def stats() -> dict:
    """Region cache and launch counters (JSON-safe)."""
    s = dict(engine.stats)
    s["flushes"] = dict(s["flushes"])
    s["regions"] = len(engine.cache.lru)
    s["queue_depth"] = len(engine.records)
    s["compiles_pending"] = worker.pending()
    s["compile_seconds"] = worker.state["seconds"]
    s["device_thread_launches"] = engine.queue.launched    # launches run on the device's thread
    s["device_thread_busy_s"] = engine.queue.busy_s        # and the seconds they took
    total = s["ops_fused"] + s["ops_per_op"]
    s["fused_share"] = s["ops_fused"] / total if total else 0.0
    lookups = s["hits"] + s["misses"]
    s["hit_rate"] = s["hits"] / lookups if lookups else 0.0
    s["mode"] = get_mode()
    return s


def regions() -> list[dict]:
    """One summary per cached region (id, ops, hits, per-op vs fused time, status)."""
    return [r.summary() for r in engine.cache.regions()]


def reset() -> None:
    """Forget every cached region and counter (a fresh engine)."""
    switch_state(None)


class EngineState:
    """What the engine learned (its regions, their programs and trials, its counters), held
    outside it by ``switch_state``."""
    __slots__ = ("attrs",)

    def __init__(self, attrs: dict) -> None:
        self.attrs = attrs


_SHARED = ("lock", "describe", "queue")     # the engine's, whatever state it holds


def switch_state(state: EngineState | None) -> EngineState:
    """Install ``state`` in the engine (None: a fresh one, as ``reset``) and return the one it
    held, after running what was queued. For measuring several models in one process, each
    with the regions it learned as if it ran alone (the benchmark's neuron peers: one peer's
    set-up used to reset the regions another peer was measured with). A compile still running
    for a region of a state that is not installed lands in that region as usual."""
    with engine.lock:            # the same lock object stays: other threads may be waiting on it
        engine.flush("reset")
        held = EngineState({k: v for k, v in engine.__dict__.items() if k not in _SHARED})
        attrs = Engine().__dict__ if state is None else state.attrs
        engine.__dict__.update({k: v for k, v in attrs.items() if k not in _SHARED})
        return held
