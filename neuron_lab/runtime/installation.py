"""The runtime as one object: ``Runtime`` owns an adaptive engine; ``install`` plugs it into the
device's runtime interface.

Importing the runtime changes nothing in the process. ``install()`` (``import neuron_lab`` calls
it once the device is registered) creates a ``Runtime`` or takes one, routes the device's calls
to it (``device.runtime_interface``) and, the first time, connects what the installed runtime needs
from the process:

- the mode knob (``NEURON_LAB_MODE``, ``set_mode``): in eager mode with nothing queued the
  device's C++ kernels run plain ops themselves, without calling the runtime;
- ``Optimizer.step()``'s global pre and post hooks: a training step's phases end there, so the
  forward+backward and the update become regions of their own without a sync;
- interpreter exit: a script's last queued ops run before it ends;
- inductor's cache directory (``TORCHINDUCTOR_CACHE_DIR``, unless set): under
  ``NEURON_LAB_CACHE_DIR``, so a kernel restart or a second run reuses compiled programs.

Each of those reads the runtime installed at the time (``current()``), so installing another
one (``installed(rt)``: the benchmark's peers, each with the regions it learned) moves them all.
Layers above read a runtime through its snapshot methods (``stats``, ``regions``, ``region``,
``launches``), never the engine's queue, trie or records.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import threading

from ..device import runtime_interface, tracking
from ..device.config import ConfigError
from ..device.executor import synchronize as _executor_sync
from . import fastpath, knobs, worker
from .adaptive import Engine
from .snapshot import LaunchCounts, RegionSnapshot

_current: Runtime | None = None
_install_lock = threading.Lock()
_connected = False


class Runtime:
    """One adaptive runtime: its engine (the op queue, the region trie and its regions, the
    counters, the device's launch thread) and the read-only views the layers above use.
    Compiles go to the process's one compile worker. Until it is installed it runs nothing."""

    def __init__(self) -> None:
        self._engine = Engine()

    @property
    def engine(self) -> Engine:
        """The engine itself: for the runtime's own modules and white-box tests; other layers
        use the snapshot methods."""
        return self._engine

    @property
    def installed(self) -> bool:
        return _current is self

    # --- running ---------------------------------------------------------------------------
    def flush(self, reason: str = "synchronize", wait: bool = True) -> None:
        """Launch what is queued; ``wait``: and wait until the device ran it."""
        self._engine.flush(reason, wait)

    def boundary(self, reason: str) -> None:
        """A step's phase ends (nothing reads a value here): end the queued region, no wait."""
        self._engine.boundary(reason)

    def sync(self, reason: str = "synchronize") -> None:
        """Flush queued work: every pending value is computed when this returns."""
        self._engine.flush(reason)
        tracking.record_sync(reason)
        _executor_sync()

    def wait_compiles(self, timeout: float | None = None) -> bool:
        """Block until background compiles finish (benchmarks and tests; user code never needs
        to). Launches still queued on the device's thread run first: a launch may queue a
        compile. False if ``timeout`` passed first."""
        self._engine.queue.wait()
        return worker.wait(timeout)

    def reset(self) -> None:
        """Run what is queued, then forget every region, program and counter."""
        e = self._engine
        with e.lock:
            e.flush("reset")
            e.forget()

    # --- snapshots -------------------------------------------------------------------------
    def stats(self) -> dict:
        """Region cache and launch counters (JSON-safe)."""
        e = self._engine
        s = dict(e.stats)
        s["flushes"] = dict(s["flushes"])
        s["regions"] = len(e.cache.lru)
        s["queue_depth"] = e.seg.depth
        s["compiles_pending"] = worker.pending()
        s["compile_seconds"] = worker.state["seconds"]
        s["device_thread_launches"] = e.queue.launched    # launches run on the device's thread
        s["device_thread_busy_s"] = e.queue.busy_s        # and the seconds they took
        total = s["ops_fused"] + s["ops_per_op"]
        s["fused_share"] = s["ops_fused"] / total if total else 0.0
        lookups = s["hits"] + s["misses"]
        s["hit_rate"] = s["hits"] / lookups if lookups else 0.0
        s["mode"] = knobs.MODE.get()
        return s

    def regions(self) -> list[RegionSnapshot]:
        """Every cached region, least recently used first."""
        return [RegionSnapshot.of(r) for r in self._engine.cache.regions()]

    def region(self, region_id: int) -> RegionSnapshot | None:
        """The cached region ``region_id`` (None: never cached, or evicted)."""
        r = self._engine.cache.lru.get(region_id)
        return None if r is None else RegionSnapshot.of(r)

    def launches(self) -> LaunchCounts:
        s, q = self._engine.stats, self._engine.queue
        return LaunchCounts(per_op=s["launches_per_op"], fused=s["launches_fused"],
                            ops_per_op=s["ops_per_op"], ops_fused=s["ops_fused"],
                            on_device_thread=q.launched, device_thread_busy_s=q.busy_s)


def current() -> Runtime:
    """The installed runtime (``import neuron_lab`` installs one)."""
    if _current is None:
        raise RuntimeError("neuron_lab: no runtime is installed; `import neuron_lab` installs "
                           "one (or call neuron_lab.runtime.install())")
    return _current


def install(runtime: Runtime | None = None) -> Runtime:
    """Make ``runtime`` (None: a new one) the device's runtime and return it. The one it
    replaces runs what it had queued first."""
    global _current
    with _install_lock:
        rt = Runtime() if runtime is None else runtime
        _connect_process()
        old = _current
        if old is rt:
            return rt
        if old is not None:
            old.flush("runtime-switch")
        _current = rt
        runtime_interface.install(fastpath.runtime_for(rt.engine))
        worker.watch(rt.engine)
        _follow_mode()
        return rt


@contextlib.contextmanager
def installed(runtime: Runtime):
    """``runtime`` installed inside the block; the one before it again after (each runs what
    it queued before the other takes over)."""
    before = current()
    install(runtime)
    try:
        yield runtime
    finally:
        install(before)


def _connect_process() -> None:
    """The process-wide hooks, once: each acts on the runtime installed when it fires."""
    global _connected
    if _connected:
        return
    import torch.optim.optimizer as optim
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(knobs.CACHE_DIR.get(), "inductor"))
    knobs.MODE.watch(_follow_mode)
    optim.register_optimizer_step_pre_hook(_optimizer_step_boundary)
    optim.register_optimizer_step_post_hook(_optimizer_step_boundary)
    atexit.register(_flush_at_exit)
    _connected = True


def _follow_mode() -> None:
    """In eager mode with nothing queued the device runs direct ops itself
    (``runtime_interface.direct``: in C++, without calling the engine); adaptive mode sends every op
    to the engine. An eager op that finds ops still queued (the mode set without ``set_mode``'s
    flush) reaches ``Engine.launch``, which flushes them and turns the switch on."""
    rt = _current
    if rt is None:
        return
    try:
        mode = knobs.MODE.get()
    except ConfigError:         # a bad NEURON_LAB_MODE: raised where the mode is read
        mode = None
    eager = mode == "eager"
    fastpath.follow_mode(mode == "adaptive")
    if eager:
        rt.engine.queue.wait()  # the device's C++ kernels run eager ops after queued launches
    runtime_interface.run_directly(eager and not rt.engine.seg.depth)


def _optimizer_step_boundary(*_) -> None:
    """``Optimizer.step()`` starts and ends a region (PyTorch's global step hooks): the
    optimizer update is one region and forward+backward another (with
    ``NEURON_LAB_BACKWARD_BOUNDARY``, a backward pass's start ends the forward's: the device's
    ``runtime_interface.boundary``), from a training loop's second step on, with no sync and no
    ``mark_step()``; a re-run notebook cell finds the steps its first run cached, although that
    run's first step also created the optimizer's state."""
    if _current is not None:
        _current.boundary("optimizer-step")


def _flush_at_exit() -> None:
    if _current is not None:
        _current.flush("exit")
