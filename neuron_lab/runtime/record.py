"""The one record type that flows through the runtime: ``QueuedOp``.

A ``QueuedOp`` is an op call as the device saw it: the op (its ``OpFacts``), the arguments as
passed (neuron tensors included, so per-op replay can run it), the output tensors it produced or
will produce, and ``key``: a hashable description that is equal for two calls exactly when a
fused program built for one is valid for the other. A region is a tuple of keys; the region
cache is a trie/dict over them; telemetry reads the same records.

Key of one argument:
- a neuron tensor produced earlier in the same region: ``("r", distance_back, output_index)``
  (relative, so a loop body has the same keys in every iteration); its template is a ``Ref``;
- any other neuron tensor (an input of the region): ``("x", shape, stride, offset, dtype)``;
- lists/tuples: a tuple of keys, except a top-level list of plain ints (sizes, dims: the common
  case) ``("ints", values)``; Python numbers: ``(type, value)`` (1, 1.0 and True differ);
  everything else (dtypes, None, strings, devices) as itself;
- a Python float of an op whose floats are data (``OpFacts.floats_are_data``: pointwise, foreach,
  fused optimizer ops): ``FLOAT``, without its value. The template keeps the value, so a per-op
  replay uses this call's own number and a fused program receives it as an input; an AdamW
  step's bias corrections then do not make every step a new region.
"""
from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch

from ..device.dtypes import HOST_ONLY
from . import core

Tensor = torch.Tensor
_num = (int, float, bool)
FLOAT = ("float",)      # the key of a float that is data (its value is a region input)


class NotQueueable(Exception):
    """This call cannot be part of a region (CPU tensor argument, unhashable argument)."""


class _Ref:
    """An argument that is output ``k`` of op ``pos`` of the same region (no strong reference).
    The reference ``NEURON_LAB_NATIVE_DEFER=0`` runs with; the extension's ``Ref``
    (``csrc/ref.cpp``) is the same in a C struct whose fields its C++ reads."""
    __slots__ = ("pos", "k")

    def __init__(self, pos: int, k: int) -> None:
        self.pos, self.k = pos, k

    def __repr__(self) -> str:
        return f"Ref({self.pos}, {self.k})"


Ref = core.implementation("Ref", _Ref)


_refs: dict = {}


def _ref(pos: int, k: int) -> Ref:
    """The (shared, immutable) ``Ref`` for output ``k`` of op ``pos``. The reference; the
    extension's ``ref`` (``csrc/ref.cpp``) keeps its Refs in a C++ table its C++ reads too."""
    r = _refs.get((pos, k))
    if r is None:
        r = _refs[(pos, k)] = Ref(pos, k)
    return r


ref = core.implementation("ref", _ref)


_tuple_new = tuple.__new__      # a NamedTuple's own __new__ is Python code: 0.2 us per record
# A pending output's weak reference: c10's weak pointer, not a cycle-collected weakref, where the
# extension is built (csrc/weak_outputs.cpp); both are called alike, ``w()``.
weak_ref = core.implementation("weak_ref", weakref.ref)


def _storage_ref(t):
    return weakref.ref(t.untyped_storage())


def _storage_id(o):
    if isinstance(o, weakref.ref):
        o = o()
        return o._cdata if isinstance(o, torch.UntypedStorage) else None
    return (o if isinstance(o, torch.UntypedStorage) else o.untyped_storage())._cdata


# A storage's weak reference and identity (the StorageImpl's address; None for a dead weak
# reference or a tensor's), from its tensor: the extension's make no Python object for the
# storage (csrc/weak_outputs.cpp), because a storage that has had one keeps a use count of two
# for good, and autograd then accumulates gradients in it out of place. The references below,
# for NEURON_LAB_NATIVE_DEFER=0, do make one.
storage_ref = core.implementation("storage_ref", _storage_ref)
storage_id = core.implementation("storage_id", _storage_id)


def _by_storage(a: Tensor, producers) -> "Ref | None":
    """A C++ shallow copy of a region output (``.data``, autograd's saved outputs) is a new
    Python object over the same storage. Every pending output has a storage of its own, so its
    storage names the producer; a captured output's storage may be shared with its views, so
    the entry is the one with the copy's metadata too (``Producers.of_storage``). Only objects
    without a cached host view can be such copies; a copy found gets an entry of its own."""
    if "_d" in a.__dict__:
        return None
    r = producers.of_storage(a, out_meta(a))
    if r is not None:
        producers.set(a, r)
    return r


def _describe(a: Any, pos: int, producers, floats: bool = False):
    """(key, template) of one argument; the template has ``Ref`` for region-internal tensors.
    ``floats``: the op's floats are data (keyed by type only)."""
    if isinstance(a, Tensor):
        if a.is_cpu or a.dtype in HOST_ONLY:
            raise NotQueueable
        r = producers.of(a)
        if r is None:
            r = _by_storage(a, producers)
        if r is not None:
            return ("r", pos - r.pos, r.k), r
        return ("x", a.shape, a.stride(), a.storage_offset(), a.dtype), a
    t = type(a)
    if t is list or t is tuple:
        pairs = [_describe(x, pos, producers, floats) for x in a]
        return tuple([k for k, _ in pairs]), t(v for _, v in pairs)
    if t is float and floats:
        return FLOAT, a
    if t in _num:
        return (t, a), a
    if t is torch.dtype:
        if a in HOST_ONLY:
            raise NotQueueable
        return a, a
    if a is None or t is str or t is torch.memory_format or t is torch.layout:
        return a, a
    if t is torch.device:
        return a, a
    raise NotQueueable


def describe(facts, args, kwargs, pos: int, producers):
    """The op's key and its argument templates (args, kwargs). On the hot path of every queued
    op: a plain tensor made earlier in the segment (the common argument) and a float that is
    data take the inline branches; everything else ``_describe``."""
    keys, targs = [], []
    floats = facts.floats_are_data
    for a in args:
        t = type(a)
        if t is Tensor:
            r = producers.of(a)
            if r is not None:                       # only neuron, queueable dtypes get entries
                keys.append(("r", pos - r.pos, r.k))
                targs.append(r)
                continue
        elif t is float and floats:
            keys.append(FLOAT)
            targs.append(a)
            continue
        elif t is list:
            for v in a:
                if type(v) is not int:
                    break
            else:                                   # sizes, dims: plain ints
                keys.append(("ints", tuple(a)))
                targs.append(a)
                continue
        k, v = _describe(a, pos, producers, floats)
        keys.append(k)
        targs.append(v)
    tkw = None
    if kwargs:
        tkw = {}
        for n in sorted(kwargs):
            k, v = _describe(kwargs[n], pos, producers, floats)
            keys.append((n, k))
            tkw[n] = v
    return (facts, tuple(keys)), tuple(targs), tkw


def rekey(key, i: int, start: int, metas_of) -> Any:
    """``key`` of op ``i`` as seen by a region starting at ``start`` (earlier producers -> inputs)."""
    if type(key) is tuple:
        if len(key) == 3 and key[0] == "r":
            if i - key[1] < start:
                m = metas_of(i - key[1])[key[2]]
                return ("x", torch.Size(m.size), m.stride, m.offset, m.dtype)
            return key
        return tuple(rekey(k, i, start, metas_of) for k in key)
    return key


def flatten_outputs(out) -> list:
    """Tensor outputs in schema order (None where a return is not a tensor)."""
    if isinstance(out, Tensor):
        return [out]
    if type(out) is tuple or type(out) is list:
        res = []
        for o in out:
            if isinstance(o, Tensor):
                res.append(o)
            elif type(o) is list:
                res.extend(o)
            else:
                res.append(None)
        return res
    return []


class _OutMeta(NamedTuple):
    """What a pending output must look like: the metadata of one tensor output of an op. A
    tuple, compared and hashed inside region and storage keys. The reference
    ``NEURON_LAB_NATIVE_DEFER=0`` runs with; the extension's ``OutMeta`` (``csrc/out_meta.cpp``)
    is the same tuple subclass in C, whose fields its C++ reads by name."""
    size: tuple
    stride: tuple
    offset: int
    dtype: torch.dtype


OutMeta = core.implementation("OutMeta", _OutMeta)


def out_meta(t: Tensor | None) -> OutMeta | None:
    """(On every captured op: the reference made with ``tuple.__new__``, as ``_QueuedOp`` is.)"""
    if t is None:
        return None
    fields = (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype)
    return _tuple_new(OutMeta, fields) if OutMeta is _OutMeta else OutMeta(*fields)


class _QueuedOp(NamedTuple):
    """One op call in the queue. ``outs``: per flattened output, None or (tensor weak_ref,
    storage weak_ref) of a pending output (a list, updated in place); ``metas``: their OutMeta
    (None where an output is not a tensor); ``structure``: how to rebuild the op's return
    value; ``where``: tracking.user_frame_token of the user's line; ``plan``: the trie node's
    OutSpecs for a deferred op (None for a captured one, whose outputs exist).

    The reference ``NEURON_LAB_NATIVE_DEFER=0`` runs with (a tuple, made with ``tuple.__new__``:
    ~0.1 us; a class with ``__init__`` took ~0.4); the extension's ``QueuedOp``
    (``csrc/queued_op.cpp``) has the same fields in a C struct its C++ builds and reads."""
    facts: Any
    args: tuple
    kwargs: dict | None
    key: Any
    outs: list
    metas: tuple = ()
    structure: Any = None
    where: Any = None
    plan: Any = None

    def __repr__(self) -> str:
        return f"QueuedOp({self.facts.name}, {len(self.outs)} outs)"


QueuedOp = core.implementation("QueuedOp", _QueuedOp)


def queued_op(*fields) -> QueuedOp:
    """A ``QueuedOp`` of its nine fields, in order (the NamedTuple's without its Python
    ``__new__``)."""
    return _tuple_new(_QueuedOp, fields)


if QueuedOp is not _QueuedOp:
    queued_op = QueuedOp     # noqa: F811 - the C type's constructor takes them as they are


def structure_of(out) -> Any:
    """A small template: 't' single tensor, ('tuple', n) / ('list', n), or the value itself."""
    if isinstance(out, Tensor):
        return "t"
    if type(out) is tuple:
        return ("tuple", tuple("t" if isinstance(o, Tensor) else ("l", len(o)) if type(o) is list
                               else ("v", o) for o in out))
    if type(out) is list:
        return ("list", len(out))
    return ("v", out)


def record_run_py(facts, targs, tkw, key, out, where, seg) -> None:
    """Queue the record of an op that ran now (the engine's capture) on segment ``seg``
    (``segment.Segment``), with its outputs' producer entries (each output's, and its storage's
    seen with its metadata; a host-only output gets none: it is never a queued argument).
    ``record_run`` is this function in C where the runtime's extension is built
    (csrc/record.cpp), ~5 us less per captured op."""
    outs = flatten_outputs(out)
    pos = seg.depth
    metas = tuple([out_meta(t) for t in outs])
    structure = structure_of(out)
    seg.append(queued_op(facts, targs, tkw, key, [None] * len(outs), metas, structure, where,
                         None))
    producers = seg.producers
    for k, t in enumerate(outs):
        if t is not None and t.dtype not in HOST_ONLY:
            r = ref(pos, k)
            producers.set(t, r)
            if not _keeps_storage_entry(t, metas[k], structure, targs, tkw, seg):
                producers.set_view_storage(t, metas[k], r)


def _keeps_storage_entry(t: Tensor, meta: OutMeta, structure, targs, tkw, seg) -> bool:
    """Does a captured output leave its storage's entry as it is? The caller's own tensor (in
    place, ``out=``) does: the deferral gives it none either. So does an identity view
    (``output_plans.identity_view``): the op's one output, a view of argument 0 (an output of
    the segment) with its metadata, over a storage that has an entry already."""
    for a in targs:
        if a is t:
            return True
    if tkw:
        for a in tkw.values():
            if a is t:
                return True
    if structure != "t" or not targs or type(targs[0]) is not Ref:
        return False
    src = targs[0]
    if seg.record(src.pos).metas[src.k] != meta:
        return False
    return seg.producers.of_storage(t, meta) is not None


def rebuild(structure, outs: list):
    """Inverse of ``flatten_outputs`` given ``structure_of``'s template."""
    if structure == "t":
        return outs[0]
    kind = structure[0]
    if kind == "list":
        return list(outs)
    if kind == "tuple":
        res, i = [], 0
        for s in structure[1]:
            if s == "t":
                res.append(outs[i])
                i += 1
            elif s[0] == "l":
                res.append(list(outs[i:i + s[1]]))
                i += s[1]
            else:
                res.append(s[1])
                i += 1
        return tuple(res)
    return structure[1]


def _record_run():
    ext = core.extension()
    if ext is None:
        return record_run_py
    ext.configure_records({"host_only": HOST_ONLY,
                           "python": record_run_py})
    return ext.record_run


record_run = _record_run()
