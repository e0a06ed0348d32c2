"""A region's status: one enum, and every transition the runtime may make, in one table.

::

    recorded --policy.maybe_compile--> queued --worker--> compiling --ok--> trial --policy--> fused
       |  ^                              |                   |  |             \\--policy--> slower
       |  +--dropped (queue closed)------+                   |  |
       |  +--cancelled at exit-------------------------------+  |
       +--graph build failed--> failed <--compile failed--------+
                                  ^---- run failed / verify mismatch -- trial, fused
    slower --backoff--> trial
    trial, fused --constant floats changed--> recorded   (compiled again, floats as data)
    trial, fused --a launch needs an output the program lacks--> recorded   (compiled again)

    any status --cache eviction--> evicted

- ``recorded``: cached, runs per-op; not (yet) worth compiling (``policy.maybe_compile``).
- ``queued`` / ``compiling``: a background compile is waiting / running; launches run per-op.
- ``trial``: compiled; the policy A/B-times fused against per-op launches.
- ``fused``: decided, launches run the fused program. ``slower``: decided, per-op; tried again
  (``trial``) after a backoff that doubles each time per-op wins (``policy.py``, rule 4).
- ``failed``: building, compiling, running or verifying the program failed; per-op for good,
  ``Region.error`` says why.
- ``evicted``: dropped from the region cache (LRU). Final: news about it from the compile
  thread (a compile that finished after the eviction) is ignored.

``Region.move(to)`` (``cache.py``) is the only writer; a transition missing from ``NEXT``
raises ``BadTransition``. The compile thread and the user's thread both move regions, so
``move`` checks and sets under one lock.
"""
from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    RECORDED = "recorded"
    QUEUED = "queued"
    COMPILING = "compiling"
    TRIAL = "trial"
    FUSED = "fused"
    SLOWER = "slower"
    FAILED = "failed"
    EVICTED = "evicted"

    def __str__(self) -> str:
        return self.value


NEXT: dict[Status, frozenset] = {
    Status.RECORDED: frozenset({Status.QUEUED, Status.FAILED}),
    Status.QUEUED: frozenset({Status.COMPILING, Status.RECORDED}),
    Status.COMPILING: frozenset({Status.TRIAL, Status.FAILED, Status.RECORDED}),
    Status.TRIAL: frozenset({Status.FUSED, Status.SLOWER, Status.FAILED, Status.RECORDED}),
    Status.FUSED: frozenset({Status.FAILED, Status.RECORDED}),
    Status.SLOWER: frozenset({Status.TRIAL}),      # revisited with backoff (policy rule 4)
    Status.FAILED: frozenset(),
    Status.EVICTED: frozenset(),
}
NEXT = {s: nxt | {Status.EVICTED} if s is not Status.EVICTED else nxt for s, nxt in NEXT.items()}


class BadTransition(RuntimeError):
    pass


def check(frm: Status, to: Status) -> None:
    if to not in NEXT[frm]:
        raise BadTransition(f"neuron_lab runtime: region status {frm.value} -> {to.value} "
                            f"is not a transition (allowed: {sorted(s.value for s in NEXT[frm])})")
