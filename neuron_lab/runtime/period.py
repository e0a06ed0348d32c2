"""The repeated-suffix rule: a segment that runs long without a sync point is cut where its ops
repeat, so a training loop without syncs becomes stable regions.

The engine asks it about every captured op once a segment has gone ``NEURON_LAB_PERIOD_AFTER``
(256) ops without a boundary (shorter segments are cut by their syncs, which makes a whole
step one region). The rule tracks a candidate period L: the distance from an op's key to that
key's last position in the segment. When the ops have repeated with period L for R more ops
(R = the smallest multiple of L that is >= ``NEURON_LAB_MIN_PERIOD_OPS``, 32, and R <=
``NEURON_LAB_MAX_PERIOD``, 512), those R ops are cut into their own region: whole periods,
long enough to be worth a fused launch. Keys are position-relative (``record.describe``), so a
loop body has the same keys in every iteration.
"""
from __future__ import annotations

from . import knobs


class PeriodRule:
    """One segment's state of the rule (the engine makes a new one per segment)."""
    __slots__ = ("cand", "match", "last_pos")

    def __init__(self) -> None:
        self.cand = 0            # candidate period L (0: none)
        self.match = 0           # ops that have repeated with period L so far
        self.last_pos: dict = {}     # key -> its last position in the segment

    def observe(self, n: int, key, records) -> int | None:
        """Op ``n`` (its record is ``records[n]``) was captured with ``key``: the position from
        which to cut the segment's ops into a region of their own, or None."""
        L = self.cand
        if L and n - L >= 0 and records[n - L].key == key:
            self.match += 1
        else:
            p = self.last_pos.get(key)
            if p is not None and 1 <= n - p <= knobs.MAX_PERIOD.get():
                self.cand, self.match = n - p, 1
            else:
                self.cand = self.match = 0
        self.last_pos[key] = n
        L = self.cand
        if not L:
            return None
        R = L * -(-knobs.MIN_PERIOD_OPS.get() // L)   # whole periods, at least MIN_PERIOD_OPS ops
        if self.match >= R and R <= knobs.MAX_PERIOD.get():
            return n - R + 1
        return None
