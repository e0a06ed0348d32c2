"""Values read before their region launches: a sync point that would wait behind the device.

A sync point (``.item()``, ``bool()`` in an ``if``) reads a pending value. Its segment would
launch there, and the host would wait for it, and, since launches run in issue order, for
every launch still queued on the device's thread (``launch_queue``) before it. A Transformers
Llama's forward reads a mask that way every step (``masking_utils``: ``(mask[:, -1] ==
0).all()`` in an ``if``), and its segment also holds the embedding's gather, whose weight the
previous step's optimizer update (queued) writes: the read waited for the whole previous step,
and the host's Python for this step's forward and backward then ran with the device idle.

``serve(engine, f, args, kwargs)`` serves such a read while the queue is busy: the ops the read
value is made of (its *cone*: the segment's ops its arguments depend on) run now, per-op on this
thread, if they read nothing queued work writes (no pending input, no input a queued launch or
an op of the segment writes in place: AdamW's ``step`` counters, read by ``.item()`` right after
``_foreach_add_`` queued their increment) and write nothing but their own outputs. Their pending
outputs receive their values, the read runs, and the segment goes on deferring. When the segment
launches (at its region's end, queued like any other), its fused program or per-op replay
computes those ops again and leaves the values already given (``pending.fill`` fills a device tensor
once). A cone of more than ``MAX_OPS`` ops, or one that depends on queued work, takes the usual
way: a flush.

The same test lets a boundary op that reads nothing queued work writes run at once when no
segment is open: a training loop's ``x.to("neuron")`` of each new batch (a fresh device
tensor from host memory) used to wait for the previous step's queued programs, and the loop
then ran with the device idle.
"""
from __future__ import annotations

import torch

from ..device import tensor_data
from ..device.executor import host_device
from .pending import fill
from .record import Ref, storage_id
from .replay import _reads, run_one

Tensor = torch.Tensor
MAX_OPS = 64


def _tensors(a):
    if isinstance(a, Tensor):
        yield a
    elif type(a) is list or type(a) is tuple:
        for x in a:
            yield from _tensors(x)


def _arguments(rec):
    return (*rec.args, *(rec.kwargs.values() if rec.kwargs else ()))


def _written(rec) -> list:
    """The arguments ``rec``'s op writes in place (its schema's mutable ones)."""
    f = rec.facts
    out = [rec.args[i] for i in f.mutates if i < len(rec.args)]
    if rec.kwargs:
        schema = f.op._schema.arguments
        out += [rec.kwargs[a.name] for i, a in enumerate(schema)
                if (i in f.mutates or a.name in f.written_kw) and a.name in rec.kwargs]
    return out


def written_storages(records) -> tuple[set, bool]:
    """(ids of the storages the ops of ``records`` write in place: an optimizer's parameters
    and state, a ``copy_`` target; does one of them write an output of ``records`` themselves,
    a ``Ref``?)."""
    out, own = set(), False
    for rec in records:
        if rec.facts.mutates or rec.facts.written_kw:
            for a in _written(rec):
                own = own or next(_reads(a, Ref), None) is not None
                for t in _tensors(a):
                    out.add(storage_id(t))
    return out, own


def _cone(records: list, positions) -> list | None:
    """The positions of the ops the outputs of ``positions`` are made of, in order; None past
    ``MAX_OPS``."""
    seen: set = set()
    stack = list(positions)
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        if len(seen) > MAX_OPS:
            return None
        for a in _arguments(records[i]):
            stack.extend(_reads(a, Ref))
    return sorted(seen)


def _independent(t: Tensor, writes: set) -> bool:
    """Does ``t`` hold its value now, with no queued launch writing it?"""
    return not tensor_data.is_pending(t) and storage_id(t) not in writes


def serve(engine, f, args, kwargs) -> bool:
    """Give the pending values ``f`` (a sync point, queue busy) reads their values now, if they
    depend on nothing queued; True if done (``f`` may then run at once)."""
    if f.random or f.mutates or f.written_kw or (engine.seg.node is None and engine.seg.depth):
        return False     # (a captured segment ran its ops already: the queue is empty then)
    records, producers = engine.seg.records, engine.seg.producers
    writes, _ = written_storages(engine.queue.records())
    segment, rewrites = written_storages(records)
    if rewrites:         # an op of the segment writes one of its outputs: which value is read?
        return False
    writes |= segment
    wanted = []
    for a in _tensors((*args, *(kwargs.values() if kwargs else ()))):
        r = producers.of(a)
        if r is not None:
            wanted.append(r.pos)
        elif not _independent(a, writes):
            return False
    cone = _cone(records, wanted) if wanted else []
    if cone is None:
        return False
    for i in cone:
        rec = records[i]
        if rec.plan is None or rec.facts.mutates or rec.facts.written_kw or rec.facts.random:
            return False
        for a in _arguments(rec):
            for t in _tensors(a):
                if not _independent(t, writes):
                    return False
    try:
        _run(records, cone)
    except Exception:  # noqa: BLE001 - the usual way (a flush) raises it, explained
        return False
    return True


def _run(records: list, positions: list) -> None:
    """Run the ops at ``positions`` (a cone: their Refs point inside it) per-op on host values;
    fill their live outputs."""
    env = (tensor_data.host_now, Ref, torch.device, host_device)
    vals: dict = {}
    for i in positions:
        vals[i] = run_one(records[i], vals, env, fill)
