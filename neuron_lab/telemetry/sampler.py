"""A background thread that samples device memory at a set rate and calls listeners.

Runs only while someone wants live data (a cell is running with the comm or dashboard open);
the side panel and the ipywidgets dashboard both hang off it. The rate is clamped to
[0.5, 20] Hz; the default 4 Hz costs one ``memory_*`` read per tick, nothing per op.
"""
from __future__ import annotations

import threading
from typing import Callable

from .store import store


class Sampler:
    def __init__(self, hz: float = 4.0) -> None:
        self.hz = hz
        self.listeners: list[Callable[[dict], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def set_rate(self, hz: float) -> float:
        self.hz = max(0.5, min(20.0, float(hz)))
        return self.hz

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="neuron_lab-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(2.0)
        self._thread = None

    def tick(self) -> dict:
        sample = store.sample_memory()
        for fn in list(self.listeners):
            try:
                fn(sample)
            except Exception:  # a broken view must not stop the others
                pass
        return sample

    def _run(self) -> None:
        while not self._stop.wait(1.0 / self.hz):
            self.tick()
