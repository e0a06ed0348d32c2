"""The repeated-suffix rule: a segment that runs long without a sync point is cut where its ops
repeat, so a training loop without syncs becomes stable regions.

The engine applies it to every captured op once a segment has gone ``NEURON_LAB_PERIOD_AFTER``
(256) ops without a boundary (shorter segments are cut by their syncs, which makes a whole
step one region). The rule tracks a candidate period L: the distance from an op's key to that
key's last position in the segment. When the ops have repeated with period L for R more ops
(R = the smallest multiple of L that is >= ``NEURON_LAB_MIN_PERIOD_OPS``, 32, and R <=
``NEURON_LAB_MAX_PERIOD``, 512), those R ops are cut into their own region: whole periods,
long enough to be worth a fused launch. Keys are position-relative (``record.describe``), so a
loop body has the same keys in every iteration.

Its state is the segment's (``Engine.seg``: ``suffix_last``, ``suffix_period``,
``suffix_match``, and the two knobs read at the segment's start, ``suffix_min`` and
``suffix_max``). ``observe`` runs in C where the runtime's extension is built
(``csrc/repeated_suffix.cpp``): the capture of an op calls no Python for it; the engine is
called (``Engine._cut_repeats``) only when the rule cuts. This function is the reference.
"""
from __future__ import annotations

from . import core


def start(seg, min_ops: int, max_period: int) -> None:
    """A new segment: no candidate period, no key seen."""
    seg.suffix_last = {}
    seg.suffix_period = seg.suffix_match = 0
    seg.suffix_min, seg.suffix_max = min_ops, max_period


def observe_py(seg, n: int, key) -> int:
    """Op ``n`` of segment ``seg`` (its record is ``seg.record(n)``) was captured with ``key``:
    the position from which to cut the segment's ops into a region of their own, or -1."""
    L = seg.suffix_period
    if L and n - L >= 0 and seg.record(n - L).key == key:
        seg.suffix_match += 1
    else:
        p = seg.suffix_last.get(key)
        if p is not None and 1 <= n - p <= seg.suffix_max:
            seg.suffix_period, seg.suffix_match = n - p, 1
        else:
            seg.suffix_period = seg.suffix_match = 0
    seg.suffix_last[key] = n
    L = seg.suffix_period
    if not L:
        return -1
    R = L * -(-seg.suffix_min // L)      # whole periods, at least suffix_min ops
    if seg.suffix_match >= R and R <= seg.suffix_max:
        return n - R + 1
    return -1


observe = core.implementation("observe_repeats", observe_py)
