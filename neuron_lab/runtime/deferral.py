"""Deferral: hand out an op's outputs as pending tensors while its region is still arriving.

An op whose key continues a known trie path does not run: the trie node predicts its outputs'
metadata, so each output is a new pending tensor (``device/tensor_data.py``) that the region's
launch fills later. Per output that is one tensor creation, two weak references and two producer
entries in the segment's map; the memory bound is one addition and one comparison
(``_admit_pending``). A node's plan (``output_plans.out_plan``, ``output_plans.FastOut``) is
derived at its first deferral (``output_plans.derive``).

The deferral hot path is C++ (``csrc/deferral.cpp``, installed by ``fastpath``): it does the
same steps on the same objects (calling ``output_plans.derive`` at a node's first deferral) and
calls this module only for an in-place op that changes its tensor's metadata (``t_``,
``resize_``: ``tensor_data.restride_meta``). With
``NEURON_LAB_NATIVE_DEFER=0`` every deferral runs here: this is the reference the C++ is tested
against (tests/runtime/test_fastpath.py). ``Deferral`` is the adaptive engine's part that does
it (``adaptive.Engine``); it reads the engine's segment (``seg``), ``queue`` and ``flush``.
"""
from __future__ import annotations

import torch

from ..device import memory, tensor_data, tracking
from ..device.dtypes import HOST_ONLY
from . import core, pending
from .cache import Node
from .launch_queue import LaunchQueue
from .output_plans import CALLER, PENDING, derive
from .record import queued_op, rebuild, ref, storage_ref, weak_ref
from .segment import Segment

Tensor = torch.Tensor
_executed = tracking.executed
# _defer's device tensors for several outputs: pending_tensors.cpp where the extension is built
_pending = core.implementation("pending", tensor_data.pending)
_pending_dense = core.implementation("pending_dense", tensor_data.pending_dense)


class Deferral:
    """The adaptive engine's deferral (``adaptive.Engine`` inherits it): it reads and writes
    the engine's ``seg``, waits on its ``queue`` and calls its ``flush``."""
    seg: Segment
    queue: LaunchQueue

    def _defer(self, f, args, kwargs, targs, tkw, key, nxt: Node):
        """Hand out ``f``'s outputs without running it (the trie predicts their metadata): per
        output one tensor creation, two weak references and two producer entries; memory is one
        addition and one comparison (``_admit_pending``). Ops with one new tensor output (most)
        take ``_defer_one``, their plan precomputed on the trie node."""
        seg = self.seg
        pos = seg.depth
        fast = nxt.fast
        if fast is None:                   # the node's first deferral
            fast = derive(nxt, f, pos, seg)
        if fast:
            return self._defer_one(f, (key, targs, tkw), nxt, fast)
        plan = nxt.plan
        new = nxt.new_bytes
        if new:
            seg.queued_bytes += new
            if seg.queued_bytes > seg.headroom:
                self._admit_pending(f, new)
        outs, pairs = [], []
        prod = seg.producers
        for k, spec in enumerate(plan):
            kind = spec.kind
            if kind == PENDING:                            # a value this region will compute
                m = spec.meta
                t = (_pending_dense(m.size, m.dtype) if spec.dense
                     else _pending(m.size, m.stride, m.dtype, m.offset))
                if spec.view:
                    tensor_data.hold_storage(t)
                tr, sr = weak_ref(t), storage_ref(t)
                outs.append(t)
                pairs.append((tr, sr))
                if spec.queueable:
                    r = ref(pos, k)
                    prod.set(t, r)
                    prod.set_storage(t, r)
            elif kind == CALLER:                           # in-place / out=: caller's tensor
                a = spec.arg
                t = args[a] if type(a) is int else kwargs[a]
                m = spec.meta
                if f.restride and m is not None:           # t_, squeeze_, resize_...: new shape now
                    tensor_data.restride_meta(t, m.size, m.stride, m.offset)
                outs.append(t)
                pairs.append(None)
            else:                                          # not a tensor
                outs.append(None)
                pairs.append(None)
        for k in nxt.alias_outs:                     # in-place results are produced here
            t = outs[k]
            if t is not None and t.dtype not in HOST_ONLY:
                prod.set(t, ref(pos, k))
        seg.append(queued_op(f, targs, tkw, key, pairs, nxt.metas, nxt.structure, nxt.where,
                             plan))
        seg.node = nxt
        _executed[f.name] += 1          # executed_ops() counts ops the user ran, however launched
        # A completed region launches at the next op or sync point, not now: the caller's frame
        # still holds this op's inputs, which would make them program outputs (an extra write
        # of each and a higher peak memory).
        if seg.pressure:
            seg.pressure = False
            self.flush("memory")
        return rebuild(nxt.structure, outs)

    def _defer_one(self, f, described, nxt: Node, fast) -> Tensor:
        """``_defer`` for the common op (``output_plans.FastOut``: one new contiguous tensor)."""
        seg = self.seg
        pos = seg.depth
        if fast.nbytes:
            seg.queued_bytes += fast.nbytes
            if seg.queued_bytes > seg.headroom:
                self._admit_pending(f, fast.nbytes)
        if fast.dense:
            t = _pending_dense(fast.size, fast.dtype)
        else:
            t = _pending(fast.size, fast.stride, fast.dtype, fast.offset)
        if fast.view:
            tensor_data.hold_storage(t)
        tr, sr = weak_ref(t), storage_ref(t)
        if fast.queueable:
            prod = seg.producers
            prod.set(t, fast.ref)
            same = fast.same_as
            if same is None:
                prod.set_storage(t, fast.ref)
            else:                          # an identity view: its storage names the first
                prod.set_storage(t, ref(pos - same[0], same[1]))
        seg.append(queued_op(f, described[1], described[2], nxt.key, [(tr, sr)], nxt.metas, "t",
                             nxt.where, nxt.plan))
        seg.node = nxt
        _executed[f.name] += 1
        if seg.pressure:
            seg.pressure = False
            self.flush("memory")
        return t

    def _admit_pending(self, f, new: int) -> None:
        """The bound on this segment's pending bytes crossed 90% of the capacity: count the
        live ones exactly. Past the capacity, OutOfMemoryError before anything is handed out;
        past 90%, flush right after handing this op's outputs out."""
        seg = self.seg
        memory.check(new, f.name)
        live = self.pending_bytes()
        seg.queued_bytes = live + new          # the bound starts again from the exact value
        seg.headroom = 0.9 * memory.capacity() - memory.counted()
        if live + new > seg.headroom:
            seg.pressure = True

    def pending_bytes(self) -> int:
        """Bytes of this segment's pending outputs still alive and still without a value (the
        device's ``runtime_interface.pending_bytes``: they count in ``memory_allocated()``). May be
        called from another thread (the telemetry sampler): reads a snapshot of the queue."""
        seg = self.seg
        n = pending.unfilled_bytes(seg.records) if seg.queued_bytes else 0
        if self.queue.busy():    # launches queued on the device's thread, not yet filled
            n += pending.unfilled_bytes(self.queue.records())
        return n
