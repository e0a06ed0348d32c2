"""``enable_all()`` / ``disable_all()``: every telemetry part a live notebook session runs, on or
off at once, outside IPython. The benchmark's telemetry-overhead workload (W1T) uses it, so
"everything on" means the same thing there as in a notebook with the side panel open:

- the store subscribed to the event bus (launch/compile/sync/fallback/transfer records);
- a memory sampler recording into the timeline, at the maximum push rate by default (20 Hz,
  the worst case a panel can ask for), with a listener that builds and JSON-encodes the
  ``memory`` and ``running`` pushes and checks for new fallbacks, as the comm does per tick;
- a per-cell record in progress (counter snapshot at start; the flush and deltas at the end).

``disable_all()`` ends the record, stops the sampler and unsubscribes the store, so the event
bus has no listener and the device skips building event payloads.
"""
from __future__ import annotations

import json

from .cells import cells
from .sampler import Sampler
from .store import store

_on: dict = {}


def _like_the_comm(sample: dict) -> None:
    json.dumps({"type": "memory", "v": 1, **sample})
    json.dumps({"type": "running", "v": 1, **cells.live()})
    _ = store.fallback_seq


def enable_all(hz: float = 20.0, cell_id: str = "telemetry-on") -> None:
    if _on:
        return
    store.start()
    sampler = Sampler(hz)
    sampler.set_rate(hz)
    sampler.listeners.append(_like_the_comm)
    sampler.start()
    if not cells.running:
        cells.start(cell_id)
        _on["cell"] = True
    _on["sampler"] = sampler


def disable_all() -> dict | None:
    """Everything off; returns the per-cell record that ``enable_all`` had started (or None)."""
    record = None
    if _on.pop("cell", False) and cells.running:
        record = cells.end()
    sampler = _on.pop("sampler", None)
    if sampler is not None:
        sampler.stop()
    _on.clear()
    store.stop()
    return record


def enabled() -> bool:
    return bool(_on)
