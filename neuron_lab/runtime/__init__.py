"""Layer 2, execution: the per-op (``eager``) path and the adaptive path.

``set_mode("adaptive" | "eager")`` (env ``NEURON_LAB_MODE``; default adaptive), ``mode(...)``
scoped, ``sync(reason)`` flushes queued work. Importing this package changes nothing:
``install()`` (``import neuron_lab`` calls it) creates the ``Runtime`` and plugs it into the
device's runtime interface; ``current()`` is the installed one, and the functions below act on it
(``installation.py``). Stages, one module each: ``verdict`` (is a call queued, and if not,
why), ``record`` (the queued op and its key), ``adaptive`` (queue, region formation, launches),
``deferral`` (pending outputs along a known region), ``segment`` (the queued ops' state, shared
with the C++ core), ``repeated_suffix`` (the rule that cuts long segments), ``cache`` (region
trie, LRU), ``compiler`` (records -> FX graph), ``programs`` (FX graph -> inductor program),
``worker`` (background compiles) and ``helper`` (the process they run in), ``policy`` (what to
compile, fused or per-op), ``status`` (a region's states and transitions), ``replay`` (per-op
launch), ``fused`` (fused launch), ``pending`` (giving pending outputs their values), ``errors``
(a deferred op's error named by its user's line), ``snapshot`` (the read-only views the layers
above read). The eager path is the device's own ``kernels.execute``.
"""
from __future__ import annotations

import contextlib

from . import knobs
from .installation import Runtime, current, install, installed
from .snapshot import LaunchCounts, RegionSnapshot

MODES = ("eager", "adaptive")

__all__ = ["MODES", "LaunchCounts", "RegionSnapshot", "Runtime", "current", "get_mode",
           "install", "installed", "mode", "regions", "reset", "set_mode", "stats", "sync",
           "wait_compiles"]


def get_mode() -> str:
    return knobs.MODE.get()


def set_mode(m: str) -> None:
    current().flush("mode")
    knobs.MODE.set(m)


@contextlib.contextmanager
def mode(m: str):
    current().flush("mode")
    with knobs.MODE.scoped(m):
        try:
            yield m
        finally:
            current().flush("mode")


def sync(reason: str = "synchronize") -> None:
    """Flush queued work: every pending value is computed when this returns."""
    current().sync(reason)


def wait_compiles(timeout: float | None = None) -> bool:
    """Block until background compiles finish (benchmarks and tests; user code never needs to)."""
    return current().wait_compiles(timeout)


def stats() -> dict:
    """The installed runtime's region cache and launch counters (JSON-safe)."""
    return current().stats()


def regions() -> list[dict]:
    """One JSON-safe summary per cached region of the installed runtime (id, ops, hits, per-op
    vs fused time, status): ``RegionSnapshot.summary``."""
    return [r.summary() for r in current().regions()]


def reset() -> None:
    """Forget every cached region and counter of the installed runtime."""
    current().reset()
