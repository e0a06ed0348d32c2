"""The region cache: a trie over op keys whose marked nodes are regions, LRU-bounded.

Walking the trie one op key at a time recognises a known region while its ops are still
arriving (so they can be deferred); ``Region`` holds what the runtime learned about one op
sequence: the output metadata of each op (to hand out pending tensors without running
anything), which outputs were alive (what a fused program must return), timings of both
execution kinds, and the compiled program. Stats: hits, misses, compiles, evictions.
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from typing import Any

from . import core, knobs
from .compiler import data_floats
from .output_plans import CALLER
from .snapshot import RegionSnapshot
from .status import Status, check

_ids = itertools.count(1)
_moving = threading.Lock()


class _Fields:
    """The trie node's fields, in Python: the reference ``NEURON_LAB_NATIVE_DEFER=0`` runs
    with; the extension's ``Node`` (``csrc/trie_node.cpp``) has the same ones, in a C struct
    its hot path reads."""
    __slots__ = ("children", "region", "depth", "metas", "structure", "plan", "fast", "key",
                 "where", "_new_bytes", "_alias_outs")

    def __init__(self, depth: int = 0, metas=None, structure=None, where=None, key=None) -> None:
        self.children: dict = {}
        self.region = None
        self.depth = depth
        self.metas = metas
        self.structure = structure
        self.where = where
        self.key = key
        self.plan = self.fast = self._new_bytes = self._alias_outs = None

    def extend(self, records: list, keys: list | None = None):
        """The node at the end of the path of ``records``' keys (or ``keys``) from this one,
        each missing node made on the way (of this node's type)."""
        node, new = self, False
        for i, r in enumerate(records):
            key = r.key if keys is None else keys[i]
            nxt = None if new else node.children.get(key)   # past a new node, every one is new
            if nxt is None:
                new = True
                nxt = node.children[key] = type(self)(node.depth + 1, r.metas, r.structure,
                                                      r.where, key)
            node = nxt
        return node


class Node(core.implementation("Node", _Fields)):
    """A trie node: reached by a key sequence; knows the output metadata of its last op (the key
    determines it, so it is the same for every region through this node).

    ``key``: the key that leads here from the parent (None at the root); a deferred op's record
    holds this one, not its own equal copy. ``where``: the user's line that issued this op when
    it was recorded. ``plan``: ``output_plans.out_plan``, a tuple of OutSpec built at the first
    deferral; ``fast``: ``output_plans.FastOut``, False when the op is not that simple, or None.
    ``region``: the region ending here, or None."""
    __slots__ = ()

    @property
    def new_bytes(self) -> int:
        if self._new_bytes is None:
            self._new_bytes = sum(p.nbytes for p in self.plan)
        return self._new_bytes

    @property
    def alias_outs(self) -> tuple:
        if self._alias_outs is None:
            self._alias_outs = tuple(k for k, p in enumerate(self.plan) if p.kind == CALLER)
        return self._alias_outs


class Region:
    """One cached op sequence; ``status`` follows ``status.NEXT``, changed only by ``move``."""

    def __init__(self, keys: tuple, records: list, node: Node) -> None:
        self.id = next(_ids)
        self.keys = keys
        self.node = node
        self.names = [r.facts.name for r in records]
        self.metas = [r.metas for r in records]
        self.structures = [r.structure for r in records]
        self.hits = 0
        self.status = Status.RECORDED
        self.program: Any = None        # compiled fused callable
        self.relayout: Any = None       # (program, layout.misplaced outputs), first launch
        self.plan: Any = None           # compiler.Plan: inputs/outputs wiring
        self.error: str | None = None
        self.per_op_s: list[float] = []
        self.fused_s: list[float] = []
        self.compile_s: float | None = None
        self.fused_launches = 0
        self.beside_host = False        # a launch nobody waited for (Engine._launch): fused,
                                        # it runs beside the host (programs.Build.beside_host)
        self.verified = 0               # fused launches checked against per-op (NEURON_LAB_VERIFY)
        self.trial = 0
        self.since_decided = 0          # launches since the policy judged it slower
        self.backoff = 0                # launches before a slower region is tried again (policy)
        self.per_op_launches = 0
        # its data floats while constant (policy rule 6), from its capture on: a region
        # compiled at its first hit sees whether they changed since the capture
        self.floats_seen: Any = data_floats(records)
        self.floats_before: Any = None  # those of its specialized program, after they changed
        self.wanted: frozenset = frozenset()  # outputs launches needed beyond a program's (rule 7)
        self.widened = 0                # recompiles for them (policy rule 7)

    def move(self, to: Status, error: str | None = None) -> bool:
        """The one place a region's status changes (``status.NEXT`` lists the transitions).
        Entering ``failed``/``evicted`` drops the program. False if the region was
        evicted meanwhile (the move is ignored)."""
        with _moving:
            if self.status is Status.EVICTED:
                return False
            check(self.status, to)
            self.status = to
            if error is not None:
                self.error = error[:500]
            if to in (Status.FAILED, Status.EVICTED):
                self.program = None
            return True

    @property
    def ops(self) -> int:
        return len(self.keys)

    def summary(self) -> dict:
        """JSON-safe, as ``snapshot.RegionSnapshot.summary`` gives it."""
        return RegionSnapshot.of(self).summary()


class RegionCache:
    def __init__(self) -> None:
        self.root = Node()
        self.lru: OrderedDict[int, Region] = OrderedDict()
        self.stats = {"hits": 0, "misses": 0, "evictions": 0, "compiles_queued": 0,
                      "compiles_done": 0, "compiles_failed": 0, "compiles_slower": 0}

    def insert(self, records: list, keys: list | None = None) -> Region:
        """Mark the path of ``records``' keys (or ``keys``) as a region (a miss), or return the
        existing one."""
        node = self.root.extend(records, keys)
        if node.region is not None:
            return node.region
        region = node.region = Region(tuple(keys or [r.key for r in records]), records, node)
        self.stats["misses"] += 1
        self.lru[region.id] = region
        limit = knobs.CACHE_SIZE.get()
        while len(self.lru) > limit:
            _, old = self.lru.popitem(last=False)
            old.node.region = None
            old.move(Status.EVICTED)        # a queued compile of it is dropped (worker._loop)
            self.stats["evictions"] += 1
        return region

    def hit(self, region: Region) -> None:
        region.hits += 1
        self.stats["hits"] += 1
        self.lru.move_to_end(region.id)

    def regions(self) -> list[Region]:
        return list(self.lru.values())

    def clear(self) -> None:
        self.__init__()
