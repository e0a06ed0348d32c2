"""The adaptive engine: queue ops, cut them into regions, recognise regions, launch them fused.

State machine per op (``Engine.launch``, installed through the device's ``runtime_interface``):

- **capture** (default at a segment start when the trie knows no region starting with this op):
  the op runs now (per-op) and is recorded. The segment ends at a *boundary* and is cached as a
  region: sync points (``item``/``cpu``/``repr``/data-dependent shapes), ``sync()``, the end of
  a cell or script, the start and end of ``Optimizer.step()`` (a training step is then two
  regions, forward+backward and the update; with ``NEURON_LAB_BACKWARD_BOUNDARY`` the start of
  a ``backward()`` of ``neuron`` roots ends the forward's, through the device's
  ``runtime_interface.boundary``), ops that cannot be queued (``verdict.py`` decides, with the
  reason: RNG other than dropout's mask and random factories, which are drawn at the call without a
  cut; host fallbacks; CPU tensor arguments other than 0-dim ones, which are copied to the
  device at the call), the queue limit (1024), and the **repeated-suffix rule**
  (``repeated_suffix.py``: a segment that has gone ``NEURON_LAB_PERIOD_AFTER`` = 256 ops
  without a sync is cut where its ops repeat, whole periods of at least 32 ops). Keys are
  position-relative, so a loop body has the same keys in every iteration; a training loop
  without syncs and a re-run notebook cell both become stable regions without mark_step().
- **replay** (the op's key continues a known trie path): nothing runs; the op gets pending
  tensors with metadata predicted from the trie (no meta-kernel on the hot path). ``launch``
  handles the common case inline: build the key, one trie lookup, ``_defer_one`` (see
  docs/performance.md for what each step costs). Pending outputs are not allocated: the
  engine keeps a bound on their bytes per segment and counts them exactly only near the
  capacity (``pending_bytes`` is what ``memory_allocated()`` adds). When the path
  reaches a region's end it is launched: the fused program if the policy says so, else a per-op
  replay. If the ops diverge from every known path, the deferred ops are replayed per-op and the
  engine continues in capture; a long shared prefix (>= ``NEURON_LAB_MIN_SPLIT`` ops) is cut
  into a region of its own so the next divergence at the same place is a hit.

With ``NEURON_LAB_ASYNC=1``, a region nobody waits for (the next op left its path, a step's
phase boundaries) is launched on the device's thread (``launch_queue``, which says why that is
opt-in on the CPU executor) and the host goes on; a flush for a value,
a sync point or any op the host runs now waits for that queue first, unless the values it
reads depend on nothing queued (``cone_reads``).
"""
from __future__ import annotations

import sys
import threading
import time

import torch

from ..device import events, kernels, memory, runtime_interface, tensor_data, tracking
from . import (cone_reads, dropout, errors, knobs, pending, policy, repeated_suffix, replay,
               verdict, worker)
from .cache import RegionCache
from .deferral import Deferral
from .interrupts import deferred_interrupts
from .launch_queue import Job, LaunchQueue
from .record import NotQueueable, describe, record_run, rekey
from .segment import Segment
from .status import Status
from .verdict import QUEUED, Kind, Verdict

Tensor = torch.Tensor
_execute = kernels.run_now     # capture and ops run at once: the direct kernel where it can
_executed = tracking.executed
_OP_BITS = verdict.OP_BITS     # {OpFacts: bits} (verdict.py)
_PLAIN_BIT = verdict.PLAIN_BIT  # every call of the op is queued


class Engine(Deferral):
    """One queue for the device, shared by every thread that issues ops (and by PyTorch's
    autograd device thread where it runs a pass, so forward and backward stay one region).
    ``lock`` (reentrant) guards the queue, the trie position and the region cache: a thread
    holds it while it captures, defers or launches, and while it materializes a pending value;
    threads doing anything else never wait for it. Ops from several threads interleave into the
    queue in the order they were issued, which is a valid order for each thread: results equal
    each thread's eager results (tests/runtime/test_threads.py). The device model runs one thing
    at a time in issue order anyway (see ``device/streams.py``); what the lock serialises is
    the host work of launching, not the threads' other Python. A launch queued on the device's
    thread (``queue``) runs without the lock: it touches only its own records, their region and
    the pending tensors it fills.

    The segment's state (the queued records, the producers map, the trie position, the
    pending-bytes bound...) is ``seg`` (segment.py), one object for the engine's life that the
    C++ core reads and writes in its struct; the engine's Python reads it there too."""

    describe = staticmethod(describe)   # keys; fastpath sets the C implementation on the instance

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.queue = LaunchQueue()
        self._reading_thread = 0   # the thread running a read ``cone_reads`` made independent
        self.seg = Segment()    # one for the engine's life: the C path holds it
        self._launching = 0     # launches running on this engine's issuing threads
        self.forget()

    def active(self) -> bool:
        """Is the engine at work: ops queued in the open segment, a launch running, or
        launches queued on the device's thread? A background compile's load waits while it is
        (``worker.watch``)."""
        return self.seg.depth > 0 or self._launching > 0 or self.queue.busy()

    def forget(self) -> None:
        """Start learning again: no region, program or counter. With nothing queued
        (``Runtime.reset`` flushes first, under the lock)."""
        seg = self.seg
        self.cache = RegionCache()
        self.last_error: str | None = None      # the last deferred op that failed, explained
        self.stats = self.cache.stats
        self.stats.update({"launches_per_op": 0, "launches_fused": 0, "ops_fused": 0,
                           "ops_per_op": 0, "ops_deferred": 0, "flushes": {}, "max_depth": 0,
                           "verify_mismatches": 0, "reads_served": 0})
        seg.root = self.cache.root
        seg.stats = self.stats
        self._reset()

    def _reset(self) -> None:
        seg = self.seg
        seg.clear()                    # no record, no producer entry
        seg.node = None
        repeated_suffix.start(seg, knobs.MIN_PERIOD_OPS.get(), knobs.MAX_PERIOD.get())
        seg.queued_bytes = 0
        seg.headroom = 0.0
        seg.pressure = False
        seg.period_after = knobs.PERIOD_AFTER.get()     # read once a segment
        seg.queue_limit = knobs.QUEUE_LIMIT.get()

    # --- entry point ---------------------------------------------------------------------
    def launch(self, f, args, kwargs):
        seg = self.seg
        if knobs.MODE.get() != "adaptive":
            if seg.depth or self.queue.busy():
                self.flush("mode")
                runtime_interface.run_directly(True)   # nothing queued: the device runs ops itself
            return _execute(f, args, kwargs)
        with self.lock:
            node = seg.node
            if (node is not None and _OP_BITS.get(f, 0) & _PLAIN_BIT
                    and node.depth == seg.depth):
                # the hot path: deferring along a known region, one op at a time
                try:
                    described = describe(f, args, kwargs, node.depth, seg.producers)
                except NotQueueable:
                    return self._adaptive(f, args, kwargs)
                nxt = node.children.get(described[0])
                if nxt is not None and nxt.fast:
                    return self._defer_one(f, described, nxt, nxt.fast)
                return self._adaptive(f, args, kwargs, described)
            return self._adaptive(f, args, kwargs)

    def _adaptive(self, f, args, kwargs, described=None):
        """Every case of ``launch``: boundaries, capture, deferral, launching a completed
        region. ``described``: (key, templates) of this call if ``launch`` built them."""
        seg = self.seg
        node = seg.node
        if node is not None and node.depth != seg.depth:
            self._diverge()     # an interrupt hit _defer between queueing and moving on
            described = None
        if not seg.depth:      # a segment starts here
            self._start_segment()
        v = verdict.call(f, args, kwargs)
        if v is not QUEUED:
            return self._not_queued(v, f, args, kwargs)
        pos = seg.depth
        if described is None:
            try:
                described = self.describe(f, args, kwargs, pos, seg.producers)
            except NotQueueable:
                return self._not_queued(verdict.host_args(f, args, kwargs), f, args, kwargs)
        key, targs, tkw = described
        if seg.node is not None:                       # deferring along a trie path
            nxt = seg.node.children.get(key)
            if nxt is not None:
                return self._defer(f, args, kwargs, targs, tkw, key, nxt)
            if seg.node.region is not None:            # a region ended: launch, start anew
                self._launch(seg.node.region, wait=False)
                return self._adaptive(f, args, kwargs)
            self._diverge()
            key, targs, tkw = self.describe(f, args, kwargs, seg.depth, seg.producers)
        elif not seg.depth:                            # segment start: known region?
            nxt = self.cache.root.children.get(key)
            if nxt is not None:
                seg.node = self.cache.root
                return self._defer(f, args, kwargs, targs, tkw, key, nxt)
        return self._capture(f, args, kwargs, targs, tkw, key)

    def _not_queued(self, v: Verdict, f, args, kwargs):
        """Carry out a verdict other than ``QUEUE`` (``verdict.py``)."""
        kind = v.kind
        if kind is Kind.COPY_SCALARS:       # CPU scalars: their values now, on neuron
            return self._adaptive(f, *v.call)
        if kind is Kind.DRAW_NOW:
            if v.call is None:              # dropout: its mask drawn now, its products queued
                return dropout.queued(f, args, kwargs)
            return self._run_now(f, *v.call)   # a factory, a *_like: drawn now, no cut
        if self.queue.busy() and cone_reads.serve(self, f, args, kwargs):
            return self._run_read_now(f, args, kwargs)     # RUN_NOW: reads nothing queued
        self.flush(v.reason)
        return self._run_now(f, args, kwargs)

    def _start_segment(self) -> None:
        """A segment starts: what is left before 90% of the capacity (``_admit_pending``'s
        bound). deferral.cpp calls it where it starts a segment with a known region's op."""
        self.seg.headroom = 0.9 * memory.capacity() - memory.counted()

    def _run_now(self, f, args, kwargs):
        """Run ``f`` at once: after a flush that waited for the device (a boundary), or an op
        whose outputs are new and whose inputs are not read (a random factory: the queue may
        still run)."""
        worker._add("launches_per_op", 1, self.stats)   # the device's thread counts them too
        worker._add("ops_per_op", 1, self.stats)
        return _execute(f, args, kwargs)

    def _run_read_now(self, f, args, kwargs):
        """Run a sync point whose values ``cone_reads`` gave now, without waiting for the queue (it
        reads nothing a queued launch writes); the segment goes on deferring."""
        self.stats["reads_served"] += 1
        self._reading_thread = threading.get_ident()
        try:
            return self._run_now(f, args, kwargs)
        finally:
            self._reading_thread = 0

    # --- capture -------------------------------------------------------------------------
    def _capture(self, f, args, kwargs, targs, tkw, key):
        seg = self.seg
        pos = seg.depth
        if not pos:      # a capture segment runs its ops now: after the queued launches
            self.queue.drain()
        out = _execute(f, args, kwargs)
        worker._add("launches_per_op", 1, self.stats)
        worker._add("ops_per_op", 1, self.stats)
        record_run(f, targs, tkw, key, out, tracking.user_frame_token(2),  # ~1.5 us: errors
                   seg)                                                  # name the line
        if pos >= seg.period_after:
            start = repeated_suffix.observe(seg, pos, key)
            if start >= 0:
                self._cut_repeats(start)
                return out
        if pos + 1 >= seg.queue_limit:
            self.flush("queue-limit")
        return out

    def _cut_repeats(self, start: int) -> None:
        """The repeated-suffix rule (``repeated_suffix.py``) cut the segment at ``start``: its
        ops from there on become a region, and the segment ends."""
        recs = self.seg.records
        keys = [rekey(r.key, start + j, start, lambda i: recs[i].metas)
                for j, r in enumerate(recs[start:])]
        with deferred_interrupts():     # the region is cached and the segment ends, or neither
            self.cache.insert(recs[start:], keys)
            self._debug("period", len(recs) - start)
            self._end_segment("period")

    def _launch(self, region, wait: bool = True) -> None:
        """Launch the segment as ``region``: queued on the device's thread if that is on
        (``NEURON_LAB_ASYNC``), nobody waits for it (not ``wait``) and its fused program is
        decided on (``Status.FUSED``; a region launched unwaited gets the C++ wrapper, whose
        launch holds no GIL, so the host's Python runs beside it); else here and now, after the
        queue. A per-op replay holds the GIL nearly throughout, so beside the host's Python it
        would only slow both; a trial's samples are timed where nothing competes. Nor while a
        compile runs: the helper process uses the other core then, and fused launches queued
        beside it slow the user's loop (the bench's W7 measures that loop)."""
        worker.note_activity()               # background compiles' loads wait for a pause
        self._launching += 1
        try:
            self._launch_segment(region, wait)
        finally:
            self._launching -= 1
            worker.note_activity()

    def _launch_segment(self, region, wait: bool) -> None:
        recs = self.seg.records
        with deferred_interrupts():          # Ctrl-C lands after every pending value is filled
            self.stats["ops_deferred"] += len(recs)
            self._end_segment(None)
            self.cache.hit(region)
            self._debug("hit", region.id)
            needed = pending.live_outputs(recs)
            beside = not wait and knobs.ASYNC.get()
            if beside:
                region.beside_host = True
            if (not beside or region.status is not Status.FUSED or worker.pending()
                    or torch.autograd.profiler._is_profiler_enabled):
                self.queue.wait()            # in issue order (a queued error: the next drain)
                self._run_launch(region, recs, needed)
            else:
                self.queue.submit(Job(lambda: self._run_launch(region, recs, needed), recs))

    def _run_launch(self, region, recs: list, needed: set) -> None:
        """Run a launched segment (per-op or fused, ``policy.run``), then maybe compile it."""
        t_host = time.perf_counter()
        with _range(region, "fused" if region.program is not None else "per-op"):
            try:
                dt = policy.run(region, recs, needed, self.stats)
            except Exception as e:
                self._explain(e, len(recs), f"region {region.id}")
                raise
        events.emit(events.LAUNCH, region=region.id, ops=region.ops,
                    kind="fused" if dt[1] else "per-op", seconds=time.perf_counter() - t_host)
        policy.maybe_compile(region, recs, needed, self.stats)

    def _diverge(self) -> None:
        """The deferred ops left every known path: run them per-op, continue capturing."""
        seg = self.seg
        recs, node = seg.records, seg.node
        self.queue.wait()                    # its per-op replay runs here, after the queue
        with deferred_interrupts():          # Ctrl-C lands after every pending value is filled
            if node.depth >= knobs.MIN_SPLIT.get() and node.depth == len(recs):
                self.cache.insert(recs)
                self._debug("split", node.depth)
            try:
                replay.per_op(recs)
            except Exception as e:
                self._explain(e, len(recs), "a deferred segment")
                self._reset()
                raise
            worker._add("launches_per_op", 1, self.stats)
            worker._add("ops_per_op", len(recs), self.stats)
            self.stats["ops_deferred"] += len(recs)
            for r in recs:
                r.outs[:] = [None] * len(r.outs)
            seg.node = None

    # --- boundaries -----------------------------------------------------------------------
    def flush(self, reason: str = "synchronize", wait: bool = True) -> None:
        """End the current segment: launch/replay deferred ops, cache captured ones. ``wait``:
        the host touches device data next, so every queued launch runs first (and a launch
        that failed on the device's thread raises here); without it (a step boundary) the
        segment may be queued."""
        seg = self.seg
        if seg.depth:
            with self.lock:
                if seg.depth:         # another thread may have flushed it meanwhile
                    self._flush(reason, wait)
        if wait:
            self.queue.drain()

    def boundary(self, reason: str) -> None:
        """The device's ``runtime_interface.boundary``: a step's phase ends (``Optimizer.step()``
        starts or ends; a backward pass starts, with ``NEURON_LAB_BACKWARD_BOUNDARY``) and nothing
        reads a value here: end the segment without waiting, so a region decided fused goes to the
        device's thread and the host issues the next phase's ops meanwhile."""
        if reason == "backward" and not knobs.BACKWARD_BOUNDARY.get():
            return
        if self.seg.depth:
            self.flush(reason, wait=False)

    def _flush(self, reason: str, wait: bool = True) -> None:
        worker.note_activity()               # background compiles' loads wait for a pause
        seg = self.seg
        depth = seg.depth
        fl = self.stats["flushes"]
        fl[reason] = fl.get(reason, 0) + 1
        if seg.node is not None:
            if seg.node.region is not None:
                self._launch(seg.node.region, wait)
            else:
                self._diverge()
                self._end_segment(reason, cache=True)
        else:
            self._end_segment(reason, cache=True)
        if events.active():
            events.emit(events.FLUSH, reason=reason, ops=depth, depth=depth,
                        where=tracking.user_frame_token(2, waiting=False))

    def _end_segment(self, reason, cache: bool = False) -> None:
        """Cache the segment (``cache``) and start a new one, with SIGINT deferred: a
        KeyboardInterrupt half-way would leave producer entries pointing into a new queue."""
        with deferred_interrupts():
            depth = self.seg.depth
            self.stats["max_depth"] = max(self.stats["max_depth"], depth)
            if cache and depth:
                self.cache.insert(self.seg.records)
                self._debug("miss", depth)
            self._reset()

    def _explain(self, e: Exception, n: int, where: str) -> None:
        """Name the deferred op that raised ``e`` and its user's line (``errors.explain``)."""
        self.last_error = errors.explain(e, n, where) or self.last_error

    def wait_launches(self) -> None:
        """The device's ``runtime_interface.wait_launches``: wait for the launches queued on the
        device's thread (not for the read ``_run_read_now`` runs)."""
        if self._reading_thread != threading.get_ident():
            self.queue.wait()

    def materialize(self, s) -> Tensor:
        """The host value of pending tensor ``s`` (the device asks through its runtime interface):
        run the queued work that computes it."""
        if self.queue.on_worker():   # a queued launch's input: the launches before it filled
            d = s.__dict__.get("_d")  # it, unless one of them failed
            d = d if isinstance(d, Tensor) else tensor_data._recover(s)
        else:
            with self.lock:      # the flush and the read: another thread cannot refill it between
                self.flush("materialize")
                d = s.__dict__.get("_d")
                d = d if isinstance(d, Tensor) else tensor_data._recover(s)
        if d is None:   # its producer was deferred and failed: never hand out a made-up value
            raise errors.no_value(s, self.last_error)
        return d

    def _debug(self, what: str, n) -> None:
        if knobs.DEBUG_LEVEL():
            print(f"[neuron_lab] region {what}: {n}", file=sys.stderr)


class _range:
    """``torch.profiler.record_function`` around a launch, only while a profiler is active."""
    __slots__ = ("cm",)

    def __init__(self, region, kind: str) -> None:
        self.cm = (torch.profiler.record_function(f"neuron::{kind}[region {region.id}]")
                   if torch.autograd.profiler._is_profiler_enabled else None)

    def __enter__(self):
        if self.cm is not None:
            self.cm.__enter__()

    def __exit__(self, *exc):
        if self.cm is not None:
            self.cm.__exit__(*exc)
