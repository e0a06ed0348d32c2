"""Layer 2, execution: the per-op (``eager``) path and the adaptive path.

``set_mode("adaptive" | "eager")`` (env ``NEURON_LAB_MODE``; default adaptive), ``mode(...)``
scoped, ``sync(reason)`` flushes queued work. The adaptive machinery lives in ``queue``,
``regions``, ``cache``, ``compiler``, ``worker`` and ``policy``.
"""
from __future__ import annotations

import contextlib

from ..device import config as _dconfig
from ..device import kernels, module, shell
from . import knobs

MODES = ("eager", "adaptive")


def get_mode() -> str:
    return knobs.MODE.get()


def set_mode(m: str) -> None:
    knobs.MODE.set(m)


@contextlib.contextmanager
def mode(m: str):
    with knobs.MODE.scoped(m):
        yield m


def sync(reason: str = "synchronize") -> None:
    """Flush queued work: every pending value is computed when this returns."""
    from ..device import executor
    executor.synchronize()


def stats() -> dict:
    return {"mode": get_mode()}


def regions() -> list:
    return []
