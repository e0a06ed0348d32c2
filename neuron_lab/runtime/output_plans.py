"""How a deferred op hands out its outputs: each trie node's output plan.

A node's plan is derived once, at its first deferral (``derive``), from the output
metadata the capture recorded (``record.OutMeta``): per output an ``OutSpec`` (the caller's own
tensor for an in-place or ``out=`` op, not a tensor, or a new pending tensor of known layout),
and for the common op (one new tensor returned as a plain tensor) a ``FastOut``. Both are the
extension's C types (``csrc/out_plan.cpp``), whose fields the C hot path (``csrc/deferral.cpp``)
reads from their structs; the NamedTuples here are their references
(``NEURON_LAB_NATIVE_DEFER=0``), with the same fields in the same order. ``identity_view``
names the earlier output a view of the same metadata repeats, so the deferral's storage entries
name what the capture's did (``record._keeps_storage_entry``).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..device.dtypes import HOST_ONLY
from . import core
from .record import OutMeta, Ref, ref, storage_id


# OutSpec.kind: how a deferred op hands out one output
CALLER = 0      # in-place / out=: the caller's own tensor (``arg``: position or kwarg name;
                #   ``meta``: its new metadata where the op changes it, t_ or resize_, else None)
NOT_TENSOR = 1  # the return is not a tensor
PENDING = 2     # a new pending tensor shaped by ``meta``; ``nbytes`` fresh bytes (0 for a view)


class _OutSpec(NamedTuple):
    """How one output of a trie node's op is made when the op is deferred (``out_plan``).
    ``dense``: a contiguous pending tensor at offset 0 (made without restriding); ``queueable``:
    its dtype may be an argument of a later queued op (not a host-only dtype); ``view``: the op
    returns a view of an argument (see ``out_plan``)."""
    kind: int
    arg: int | str | None
    meta: OutMeta | None
    nbytes: int
    dense: bool = False
    queueable: bool = True
    view: bool = False


OutSpec = core.implementation("OutSpec", _OutSpec)


def contiguous_strides(size) -> tuple:
    stride, acc = [], 1
    for n in reversed(size):
        stride.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(stride))


class _FastOut(NamedTuple):
    """The common deferred op, precomputed per trie node: one new pending tensor returned as
    a plain tensor (``Engine._defer_one``); ``dense``: contiguous at offset 0 (no restride);
    ``nbytes`` 0 for a view. ``same_as``: None, or (distance back, output) of the earlier
    output this one is an identity view of (``identity_view``): its storage entry names that
    output, as the capture's does. ``view``: as ``OutSpec.view``."""
    size: tuple
    stride: tuple
    offset: int
    dtype: torch.dtype
    nbytes: int
    dense: bool
    queueable: bool
    ref: Ref
    same_as: tuple | None = None
    view: bool = False


FastOut = core.implementation("FastOut", _FastOut)


def fast_out(plan: tuple, structure, pos: int, same_as: tuple | None = None) -> FastOut | None:
    """``FastOut`` for an op at segment position ``pos`` with output plan ``plan``, or None."""
    if structure != "t" or len(plan) != 1:
        return None
    spec = plan[0]
    if spec.kind != PENDING:
        return None
    m = spec.meta
    return FastOut(m.size, m.stride, m.offset, m.dtype, spec.nbytes, spec.dense, spec.queueable,
                   ref(pos, 0), same_as, spec.view)


def identity_view(facts, key, meta: OutMeta, pos: int, seg):
    """(distance back, output) of the output whose storage entry a deferred op's one output
    shares, or None. A single-output view of argument 0 with argument 0's metadata
    (``view`` to the same shape, ``_reshape_alias``, ``alias``, ``detach``) is the same tensor
    again: a C++ shallow copy of either (autograd's saved tensors) is the same value, and the
    capture cannot tell them apart (they share storage and metadata), so its storage entry
    keeps the earlier one's (``record_run``). The deferral, where every output has a storage
    of its own, names the same output: the one argument 0's storage entry names (an identity
    view of an identity view names the first). ``pos``: the op's position in segment ``seg``.
    Derived once per trie node."""
    alias = facts.ret_alias[0] if facts.ret_alias else None
    args = key[1]
    if (alias is None or alias[0] != 0 or alias[1] or not args or type(args[0]) is not tuple
            or len(args[0]) != 3 or args[0][0] != "r"):
        return None
    _, d, kk = args[0]
    src = seg.record(pos - d)
    if src.metas[kk] != meta:
        return None
    pair = src.outs[kk]
    sid = storage_id(pair[1]) if pair is not None else None
    r = seg.producers.of_pending_storage(sid) if sid is not None else None
    if r is None:
        return d, kk
    return pos - r.pos, r.k


def out_plan(facts, metas) -> tuple[OutSpec, ...]:
    """One ``OutSpec`` per output of an op with output metadata ``metas`` (derived once per trie
    node, on its first deferral).

    A pending output has a storage of its own, even for a view; in eager mode (and so in the
    capture) a view shares its base's storage, which the view's autograd metadata keeps alive
    (``_base``): the storage's use count is two while the view lives. Autograd accumulates a
    gradient in place only into a tensor whose storage's use count is one, so a view gradient
    is accumulated out of place in eager mode. A pending view (``OutSpec.view``) holds its
    storage twice for its life (``tensor_data.hold_storage``), so every pass of a step runs the
    same accumulating op as the capture did (``add``, not ``add_``), and the step's ops stay
    the region's."""
    plan = []
    for i, m in enumerate(metas):
        alias = facts.ret_alias[i] if i < len(facts.ret_alias) else None
        if alias is not None and alias[1] and not alias[2]:
            plan.append(OutSpec(CALLER, alias[0], m if facts.restride else None, 0))
        elif m is None:
            plan.append(OutSpec(NOT_TENSOR, None, None, 0))
        else:
            numel = 1
            for n in m.size:
                numel *= n
            dense = m.offset == 0 and tuple(m.stride) == contiguous_strides(m.size)
            plan.append(OutSpec(PENDING, None, m, 0 if alias else numel * m.dtype.itemsize,
                                dense, m.dtype not in HOST_ONLY, alias is not None))
    return tuple(plan)


def derive(node, facts, pos: int, seg):
    """Derive trie node ``node``'s output plan at its first deferral (op ``facts``, the
    ``pos``-th of segment ``seg``): ``node.plan`` and ``node.fast`` (a ``FastOut``, or False
    when the op is not that simple). Returns ``node.fast``. The deferral calls it (C and
    Python alike) when the node's ``fast`` is still None."""
    node.plan = out_plan(facts, node.metas)
    same = identity_view(facts, node.key, node.metas[0], pos, seg) \
        if node.structure == "t" else None
    node.fast = fast_out(node.plan, node.structure, pos, same) or False
    return node.fast
