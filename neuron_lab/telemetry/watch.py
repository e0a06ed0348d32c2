"""Change detection while no cell runs: the "on change when idle" half of the live views.

Between cells the device is not silent: the compile worker finishes fused programs (regions
turn ``ready`` or ``failed``), a user's background thread allocates or falls back, a mode is
switched. ``ChangeWatcher`` polls a cheap ``signature()`` (a handful of counters, about a
microsecond) at a low rate and calls its listeners only when the signature moved, so an idle
kernel with the panel open sends nothing. While a cell runs the ``Sampler`` pushes instead;
the extension pauses the watcher for the duration of the cell.
"""
from __future__ import annotations

import threading
from typing import Callable

from .. import runtime
from ..device import memory
from .store import store
from .ticker import Ticker

IDLE_HZ = 1.0


def signature() -> tuple:
    """What the views show, reduced to numbers that change when the views would."""
    s = runtime.stats()
    with store.lock:
        seq, n_compiles, n_cells = store.fallback_seq, len(store.compiles), len(store.cells)
    return (memory.memory_allocated(), memory.memory_reserved(), seq, n_compiles, n_cells,
            runtime.get_mode(), s.get("regions"), s.get("compiles_done"),
            s.get("compiles_failed"), s.get("compiles_pending"))


class ChangeWatcher(Ticker):
    thread_name = "neuron_lab-watch"

    def __init__(self, hz: float = IDLE_HZ) -> None:
        super().__init__(hz)
        self.listeners: list[Callable[[], None]] = []
        self._paused = threading.Event()
        self._last: tuple | None = None

    def start(self) -> None:
        if not self.alive:
            self._last = signature()
        super().start()

    def pause(self) -> None:
        """A cell started: the sampler pushes now."""
        self._paused.set()

    def resume(self) -> None:
        """A cell ended (and its end was pushed): changes from here on are idle changes."""
        self._last = signature()
        self._paused.clear()

    def check(self) -> bool:
        """Call the listeners if the signature moved since the last check; True if it did."""
        sig = signature()
        if sig == self._last:
            return False
        self._last = sig
        for fn in list(self.listeners):
            try:
                fn()
            except Exception:  # a broken view must not stop the others
                pass
        return True

    def step(self) -> None:
        if not self._paused.is_set() and self.listeners:
            self.check()
