"""Whether an op call on ``neuron`` tensors enters the queue: one verdict, with its reason.

The adaptive engine asks this module, and only this one, what to do with a call
(``Engine._adaptive``; the C hot path reads the same answers from ``OP_BITS`` and ``PLAIN_WHEN``).
The verdict is one of:

=================  ===============================================================================
``QUEUE``          deferred along a known region or captured into the segment (the common case)
``DRAW_NOW``       draws random numbers, but reads no queued value: drawn at the call, on the host
                   generator, where eager draws them, and the segment goes on (dropout's mask,
                   whose products are queued: ``dropout.py``; a random factory or ``*_like``:
                   ``random_now.py``)
``COPY_SCALARS``   reads CPU 0-dim tensors (``x * torch.tensor(2.0)``): their values are copied to
                   the device now and the call is queued with the copies (``host_scalars.py``)
``BOUNDARY``       cannot be queued: the segment ends, queued work runs, then the op runs. Reasons:
                   ``item``/``cpu``/``transfer`` (a value crosses to the host), ``data-dependent``
                   (the output's shape depends on values: ``nonzero``, boolean indexing),
                   ``rng`` (a draw that writes or reads tensors), ``host-arg`` (a CPU tensor
                   argument), ``unqueueable`` (returns a Python value, touches the host)
``RUN_NOW``        a ``BOUNDARY`` the engine serves without waiting for the device's queue: a
                   read whose inputs nothing queued writes (``cone_reads.py``); decided by the
                   engine from its queue, not here
=================  ===============================================================================

What is decided once, per op: ``plain(f)`` (every call of ``f`` is queued: no RNG, no
data-dependent shape, no host access; cached in ``OP_BITS``, which the C path reads) and, for the
others, the one argument test that makes a call queueable (``PLAIN_WHEN``: dropout_p == 0, a cast
staying on ``neuron``). What depends on the call (a dropout probability, a cast's target device,
an index's dtype, which arguments are CPU tensors) is read per call, and a call that is queued
gets a key: the trie node its key reaches holds the rest of what is known about it.
"""
from __future__ import annotations

import enum
from typing import NamedTuple

import torch

from ..device.kernels import bool_indexing
from ..device.op_facts import draws_random
from . import dropout, host_scalars, random_now


class Kind(enum.Enum):
    QUEUE = "queue"
    DRAW_NOW = "draw-now"
    COPY_SCALARS = "copy-scalars"
    BOUNDARY = "boundary"
    RUN_NOW = "run-now"


class Verdict(NamedTuple):
    kind: Kind
    reason: str
    call: tuple | None = None       # DRAW_NOW/COPY_SCALARS: the (args, kwargs) to run or queue


QUEUED = Verdict(Kind.QUEUE, "queueable")

# Ops that never enter a region: they touch the host or other devices.
_UNQUEUEABLE = frozenset({"_copy_from", "_copy_from_and_resize", "_to_copy", "set_",
                          "resize_", "_local_scalar_dense", "record_stream", "_pin_memory",
                          "is_pinned", "equal", "allclose", "_assert_async"})
_QUEUEABLE: dict = {}


def queueable(f) -> bool:
    """Ops that touch the host, or return Python values (bool/int/float computed from data, which
    a deferred op could not know), never enter a region."""
    q = _QUEUEABLE.get(f)
    if q is None:
        q = _QUEUEABLE[f] = f.base not in _UNQUEUEABLE and all(
            "Tensor" in str(r.type) for r in f.op._schema.returns)
    return q


# {OpFacts: bits}, filled by ``plain`` at an op's first call: what the C hot path needs to know
# of an op (fastpath.configure hands it over), so it never reads an OpFacts object.
OP_BITS: dict = {}
PLAIN_BIT = 1        # every call of the op is queued (``plain``)
FLOATS_BIT = 2       # its Python floats are data, not key (OpFacts.floats_are_data)
DIRECT_BIT = 4       # the device's direct kernel can run it (OpFacts.direct_kernel)
PLAIN_WHEN: dict = {}    # {OpFacts: plain_when(f)} for the ops that are not plain (C reads it)
NO_DROPOUT, SAME_DEVICE = 1, 2


def plain(f) -> bool:
    """Is every call of ``f`` queued, whatever its arguments? (No RNG, data-dependent shape,
    host access, same-device cast or boolean indexing to look at per call.) Cached per op."""
    b = OP_BITS.get(f)
    if b is None:
        p = (not f.random and not f.data_dependent and queueable(f)
             and f.base not in ("index", "_to_copy"))
        PLAIN_WHEN[f] = None if p else _plain_when(f)
        b = OP_BITS[f] = ((PLAIN_BIT if p else 0) | (FLOATS_BIT if f.floats_are_data else 0)
                          | (DIRECT_BIT if f.direct_kernel else 0))
    return bool(b & PLAIN_BIT)


def op_bits(f) -> int:
    """``OP_BITS[f]``, made at the first ask."""
    plain(f)
    return OP_BITS[f]


def _plain_when(f):
    """For an op that is not plain, the one per-call test under which ``call`` queues a call
    like a plain op's, for the C hot path (deferral.cpp ``plain_call``) to make the same
    decision: ``(NO_DROPOUT, i, name)``: the op's only randomness is dropout and this call's
    ``dropout_p`` (argument ``i`` or keyword ``name``) is 0 (``draws_random``; every attention
    call without dropout); ``(SAME_DEVICE,)``: a ``_to_copy`` that stays on neuron
    (``same_device_cast``: a dtype cast). None: ``call`` decides every call in Python."""
    if f.data_dependent or f.base == "index":
        return None
    if f.random and f.dropout_at is not None and queueable(f):
        return (NO_DROPOUT, *f.dropout_at)
    if f.base == "_to_copy" and not f.random:
        return (SAME_DEVICE,)
    return None


def same_device_cast(f, args, kwargs) -> bool:
    """``_to_copy`` that stays on ``neuron`` (``x.float()``, ``.to(dtype)``, ``.to('neuron')`` of a
    neuron tensor) is an ordinary op, queued like any other; only a copy to another device is a
    transfer (and a sync point when it leaves the device). Otherwise a cast in the middle of a
    model (a rotary embedding's ``position_ids.float()``) would cut its forward in two."""
    if f.base != "_to_copy" or not args or args[0].is_cpu:
        return False
    dev = kwargs.get("device") if kwargs else None
    return dev is None or (dev.type if type(dev) is torch.device else str(dev).split(":")[0]) == "neuron"


_REASONS = {"_local_scalar_dense": "item", "_to_copy": "cpu", "_copy_from": "cpu",
            "_copy_from_and_resize": "cpu", "copy_": "transfer", "equal": "item",
            "allclose": "item"}


def boundary_reason(f) -> str:
    """Why an op that cannot be queued ends the current segment (the sync-reason vocabulary)."""
    if f.base in _REASONS:
        return _REASONS[f.base]
    if f.data_dependent:
        return "data-dependent"
    return "rng" if f.random else "unqueueable"


def call(f, args, kwargs) -> Verdict:
    """The verdict for this call of ``f`` before its key is built (``QUEUE``: build it; a call
    whose key cannot be built because of a host argument then gets ``host_args``'s)."""
    if plain(f):
        return QUEUED
    if f.random and draws_random(f, args, kwargs):
        if dropout.takes(f, args, kwargs):
            return Verdict(Kind.DRAW_NOW, "dropout")
        now = random_now.arguments(f, args, kwargs)
        if now is not None:
            return Verdict(Kind.DRAW_NOW, "random-factory", now)
        return Verdict(Kind.BOUNDARY, boundary_reason(f))
    if f.data_dependent or not (queueable(f) or same_device_cast(f, args, kwargs)):
        return Verdict(Kind.BOUNDARY, boundary_reason(f))
    if bool_indexing(f, args):
        return Verdict(Kind.BOUNDARY, "data-dependent")
    return QUEUED


def host_args(f, args, kwargs) -> Verdict:
    """The verdict for a call whose key could not be built (``record.NotQueueable``: a CPU
    tensor argument): ``COPY_SCALARS`` with the call's device copies when every such argument is
    a 0-dim scalar it only reads, else ``BOUNDARY`` ("transfer" for a ``copy_`` between host
    and device, else "host-arg")."""
    copied = host_scalars.copied(f, args, kwargs)
    if copied is not None:
        return Verdict(Kind.COPY_SCALARS, "cpu-scalars", copied)
    return Verdict(Kind.BOUNDARY, _REASONS.get(f.base, "host-arg"))
