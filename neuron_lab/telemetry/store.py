"""The telemetry store: what happened on the device, kept for the views and exporters.

It subscribes to the device/runtime event bus (``neuron_lab.device.events``) and keeps bounded
records — launches, compiles, sync points, fallbacks, transfers, memory samples, per-cell
records — behind one lock. Per-op counts are *not* events: they are read from the device's
counters when a snapshot is taken, so telemetry adds no per-op work.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from ..device import events, memory, tracking

_now = time.time
LAUNCHES_KEPT = 4096
SAMPLES_KEPT = 600
CELLS_KEPT = 200


class Store:
    _kept = {events.COMPILE: "compiles", events.FALLBACK: "fallback_events", events.OOM: "oom"}

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.launches: deque = deque(maxlen=LAUNCHES_KEPT)
        self.compiles: deque = deque(maxlen=512)
        self.memory: deque = deque(maxlen=SAMPLES_KEPT)
        self.cells: deque = deque(maxlen=CELLS_KEPT)
        self.oom: deque = deque(maxlen=64)
        self.fallback_events: deque = deque(maxlen=256)   # {t, op, reason, location}
        self.syncs: dict[str, int] = {}                   # sync points by reason, seen on the bus
        self.sync_sites: dict[tuple, int] = {}            # (reason, where token) -> count
        self.boundaries: dict[tuple, list] = {}           # flush (reason, where) -> [count, ops]
        self.launch_seconds = 0.0
        self.fallback_seq = 0         # bumps on every fallback event (views push on change)
        self.t0 = time.time()
        self._unsubscribe = None

    # --- bus ------------------------------------------------------------------------------
    def start(self) -> None:
        if self._unsubscribe is None:
            self._unsubscribe = events.subscribe(self._on_event, replay=True)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _on_event(self, kind: str, p: dict[str, Any]) -> None:
        # Hot path: a launch and a sync per W1 iteration. ``p`` is the fresh dict ``emit``
        # built for this event, so it is stamped and kept as is (no copy); the other kinds
        # are rare.
        if kind == events.LAUNCH:
            p["t"] = _now()
            with self.lock:
                self.launches.append(p)
                self.launch_seconds += p.get("seconds", 0.0)
        elif kind == events.SYNC:
            r = p.get("reason", "?")
            key = (r, p.get("where"))
            with self.lock:
                self.syncs[r] = self.syncs.get(r, 0) + 1
                self.sync_sites[key] = self.sync_sites.get(key, 0) + 1
        elif kind == events.FLUSH:
            key = (p.get("reason", "?"), p.get("where"))
            with self.lock:
                b = self.boundaries.get(key)
                if b is None:
                    self.boundaries[key] = [1, p.get("ops", 0)]
                else:
                    b[0] += 1
                    b[1] += p.get("ops", 0)
        elif kind in self._kept:
            p.setdefault("t", _now())        # replayed events carry the time they happened
            with self.lock:
                getattr(self, self._kept[kind]).append(p)
                if kind == events.FALLBACK:
                    self.fallback_seq += 1

    def sites(self) -> dict[str, list[dict]]:
        """Sync points and region boundaries by the user's line, most frequent first:
        ``{"syncs": [{reason, location, source, count}], "boundaries": [{..., ops}]}``.
        Locations are formatted here, on read (``Cell In[N], line M`` in a notebook)."""
        with self.lock:
            syncs, bounds = list(self.sync_sites.items()), list(self.boundaries.items())
        fmt = tracking.format_location
        out = {"syncs": [], "boundaries": []}
        for (reason, where), n in syncs:
            loc, src = fmt(where)
            out["syncs"].append({"reason": reason, "location": loc, "source": src, "count": n})
        for (reason, where), (n, ops) in bounds:
            loc, src = fmt(where)
            out["boundaries"].append({"reason": reason, "location": loc, "source": src,
                                      "count": n, "ops": ops})
        for rows in out.values():
            rows.sort(key=lambda r: -r["count"])
        return out

    # --- memory ---------------------------------------------------------------------------
    @staticmethod
    def read_memory() -> dict:
        """One memory sample, not recorded."""
        return {"t": time.time(), "allocated": memory.memory_allocated(),
                "reserved": memory.memory_reserved(), "peak": memory.max_memory_allocated(),
                "capacity": memory.capacity()}

    def sample_memory(self) -> dict:
        """One memory sample, appended to the bounded timeline the views draw."""
        s = self.read_memory()
        with self.lock:
            self.memory.append(s)
        return s

    def add_cell(self, record: dict) -> None:
        with self.lock:
            self.cells.append(record)

    def clear(self) -> None:
        with self.lock:
            self.launches.clear()
            self.compiles.clear()
            self.memory.clear()
            self.cells.clear()
            self.oom.clear()
            self.fallback_events.clear()
            self.syncs.clear()
            self.sync_sites.clear()
            self.boundaries.clear()
            self.launch_seconds = 0.0


store = Store()
store.start()
