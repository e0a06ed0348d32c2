"""A daemon thread that calls ``step()`` at ``hz`` until stopped: what the sampler (live, while a
cell runs) and the change watcher (idle) share. ``stop()`` joins (bounded) unless called from
the thread itself, so a listener that unloads the extension cannot deadlock.
"""
from __future__ import annotations

import threading


class Ticker:
    thread_name = "neuron_lab-ticker"

    def __init__(self, hz: float) -> None:
        self.hz = hz
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.alive:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(2.0)
        self._thread = None

    def step(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(1.0 / self.hz):
            self.step()
