"""A background thread that samples device memory at a set rate and calls listeners.

Runs only while someone wants live data: the extension starts it when a cell starts and stops
it when the cell ends; ``profile()`` runs a private one (``record=False``) for its trace. The
side panel and the ipywidgets dashboard both hang off it. The rate is clamped to [0.5, 20] Hz;
the default 4 Hz costs one ``memory_*`` read per tick, nothing per op.
"""
from __future__ import annotations

from typing import Callable

from .store import store
from .ticker import Ticker


class Sampler(Ticker):
    thread_name = "neuron_lab-sampler"

    def __init__(self, hz: float = 4.0, *, record: bool = True) -> None:
        super().__init__(hz)
        self.record = record          # False: samples go to the listeners only (profile())
        self.listeners: list[Callable[[dict], None]] = []

    def set_rate(self, hz: float) -> float:
        self.hz = max(0.5, min(20.0, float(hz)))
        return self.hz

    def tick(self) -> dict:
        sample = store.sample_memory() if self.record else store.read_memory()
        for fn in list(self.listeners):
            try:
                fn(sample)
            except Exception:  # a broken view must not stop the others
                pass
        return sample

    step = tick
