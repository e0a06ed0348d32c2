"""The adaptive engine's segment state: the ops queued since the last boundary and where they
stand on the region trie (``Engine.seg``, its one owner: the engine's Python and the C++ core
both read and write it here).

Where the runtime's extension is built this is its C type (``csrc/segment.cpp``), whose struct
the C++ hot path reads and writes directly: the state has one owner, and renaming a field is
a build error there, not a lookup that fails at run time. ``NEURON_LAB_NATIVE_DEFER=0`` runs
with the Python class below, the reference with the same fields.
"""
from __future__ import annotations

from . import core
from .producers import _Producers


class _Fields:
    """The segment state in Python (the reference); the C type has the same fields and
    accessors. The queued records are the segment's own: read through ``depth``, ``record(i)``
    and ``records`` (a copy), changed by ``append`` and ``clear``; so is the producers map,
    read-only as an attribute (``clear`` starts a new one)."""
    __slots__ = ("_records", "_producers", "node", "root", "stats", "queued_bytes", "headroom",
                 "pressure", "period_after", "queue_limit", "suffix_last", "suffix_period",
                 "suffix_match", "suffix_min", "suffix_max")

    def __init__(self) -> None:
        self._records: list = []         # [record.QueuedOp], in issue order
        self._producers = _Producers()   # the queued ops' outputs (producers.py)
        self.node = None                 # the trie node of the last deferred op
        self.root = None                 # the region trie's root
        self.stats = None                # the engine's counters
        self.queued_bytes = 0            # bytes of the pending outputs handed out
        self.headroom = 0.0              # queued_bytes past which they are counted exactly
        self.pressure = False            # past 90% of the capacity: flush after this op
        self.period_after = 0            # the repeated-suffix rule looks from here on
        self.queue_limit = 0             # ops queued before a forced flush
        # the repeated-suffix rule (repeated_suffix.py)
        self.suffix_last: dict = {}      # key -> its last position in the segment
        self.suffix_period = 0           # candidate period (0: none)
        self.suffix_match = 0            # ops that have repeated with it so far
        self.suffix_min = 0              # NEURON_LAB_MIN_PERIOD_OPS, read at the segment's start
        self.suffix_max = 0              # NEURON_LAB_MAX_PERIOD, likewise

    @property
    def depth(self) -> int:
        """How many ops are queued."""
        return len(self._records)

    @property
    def producers(self) -> _Producers:
        """The queued ops' outputs (``producers._Producers``; the C segment's is the C map)."""
        return self._producers

    @property
    def records(self) -> list:
        """A copy of the queued records, in issue order."""
        return list(self._records)

    def record(self, i: int):
        """The ``i``-th queued record (``i < 0`` counts from the end)."""
        return self._records[i]

    def append(self, rec) -> None:
        """Queue one more op's record."""
        self._records.append(rec)

    def clear(self) -> None:
        """No op queued and no producer entry (the segment ends); a list holding the ended
        segment's records keeps them."""
        self._records = []
        self._producers = _Producers()


Segment = core.implementation("Segment", _Fields)
