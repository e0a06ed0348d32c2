"""The instrumentation bus: how the device and runtime tell observers what happened.

Layers import one way (device -> runtime -> telemetry -> jupyter), so the lower layers cannot
call telemetry directly. Instead they ``emit`` onto this bus and telemetry ``subscribe``s.

Cost model: per-op work is *never* an event (it is a counter increment in
``neuron_lab.device.tracking``); events are for things that happen at most once per launch,
compile, sync point, fallback or transfer. ``emit`` is a no-op loop when nobody listens.

Event kinds and their payload keys (all values JSON-safe):

=================  =====================================================================
``launch``         region (int, -1 for a lone per-op launch batch), ops (int),
                   kind ("per-op" | "fused"), seconds (host seconds spent launching)
``compile``        region (int), seconds (float), outcome ("queued" | "running" | "ok" |
                   "failed" | "slower" | "dropped": evicted while queued, or at exit),
                   error (str | None)
``sync``           reason ("item" | "cpu" | "tolist" | "repr" | "bool" | "numpy" |
                   "data-dependent" | "synchronize" | "queue-limit" | "memory" | "cell-end"),
                   where (the user's line as a ``tracking.user_frame_token``: (file, line) or
                   None; ``tracking.format_location`` names it, so formatting is paid by readers)
``fallback``       op (str), reason (str), location ("file.py:12")
``transfer``       direction ("h2d" | "d2h"), nbytes (int)
``flush``          reason (same vocabulary as sync), ops (int), depth (queue depth before),
                   where (the user's line where the region ended, a token as for ``sync``)
``oom``            requested (int), allocated (int), capacity (int)
``collective``     op ("all_reduce" | "broadcast" | ...), nbytes (int), seconds (float, issue to
                   completion; emitted from the transport's thread)
=================  =====================================================================
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable

Listener = Callable[[str, dict[str, Any]], None]

LAUNCH = "launch"
COMPILE = "compile"
SYNC = "sync"
FALLBACK = "fallback"
TRANSFER = "transfer"
FLUSH = "flush"
OOM = "oom"
COLLECTIVE = "collective"

_listeners: tuple[Listener, ...] = ()
_lock = threading.Lock()
# Rare events nobody heard (no listener yet: telemetry is imported by the first metrics() call)
# are kept, stamped, for the next subscriber that asks for them: metrics()'s compile, fallback
# and OOM lists then include what happened before it was first called. Emitters send these
# kinds whether or not anyone listens (they happen at most once per compile/fallback/OOM).
KEPT = frozenset({COMPILE, FALLBACK, OOM})
_backlog: deque = deque(maxlen=1024)


def subscribe(fn: Listener, replay: bool = False) -> Callable[[], None]:
    """Call ``fn(kind, payload)`` for every event; returns the function that unsubscribes.
    ``replay``: first call it with the kept events nobody heard (and forget them)."""
    global _listeners
    with _lock:
        if replay:
            while _backlog:
                kind, payload = _backlog.popleft()
                try:
                    fn(kind, payload)
                except Exception:  # an observer must never break the program it observes
                    pass
        _listeners = _listeners + (fn,)

    def unsubscribe() -> None:
        global _listeners
        with _lock:
            _listeners = tuple(f for f in _listeners if f is not fn)

    return unsubscribe


def active() -> bool:
    """True when someone listens: lets emitters skip building a payload."""
    return bool(_listeners)


def emit(event: str, /, **payload: Any) -> None:
    if not _listeners:
        if event in KEPT:
            payload["t"] = time.time()
            _backlog.append((event, payload))
        return
    for fn in _listeners:
        try:
            fn(event, payload)
        except Exception:  # an observer must never break the program it observes
            pass
