"""Pending outputs: which of a region's passed-out tensors are still alive, and giving them values.

A deferred op's outputs are pending tensors (``tensor_data.pending``); the record keeps a weak pair
(tensor, storage) per output (``record.weak_ref``: c10 weak pointers where the runtime's
extension is built, ``weakref.ref`` otherwise; both are called, ``w()``). When the region runs
— per-op (``replay``) or fused (``fused``) — every pending tensor still alive receives its host
value; dead ones are skipped (a fused program does not even compute them). A C++ shallow copy
(``.data``, autograd's saved outputs) can outlive the Python object: then only the storage is
alive, and it gets the bytes.
"""
from __future__ import annotations

import torch

from ..device import memory, tensor_data
from . import core

Tensor = torch.Tensor


def alive(ref_pair) -> Tensor | None:
    """The pending tensor behind (tensor weak_ref, storage weak_ref), or a live alias of its
    storage."""
    if ref_pair is None:
        return None
    t = ref_pair[0]()
    if t is not None:
        return t
    st = ref_pair[1]() if ref_pair[1] is not None else None
    return st


def unfilled(ref_pair) -> bool:
    """Is the pending output behind (tensor weak_ref, storage weak_ref) alive and without a
    value?"""
    t = ref_pair[0]()
    if t is not None:
        return t.__dict__.get("_d", 0) is None
    st = ref_pair[1]()
    return st is not None and tensor_data.storage_is_pending(st)


def unfilled_bytes(records: list) -> int:
    """Bytes of the pending outputs of ``records`` still alive and still without a value (what
    ``memory_allocated()`` adds for a queue). ``records`` may be a snapshot another thread's
    queue is still growing from."""
    n = 0
    for rec in records:
        plan, outs = rec.plan, rec.outs
        if plan is None:
            continue
        for spec, pair in zip(plan, outs):
            if spec.nbytes and pair is not None and unfilled(pair):
                n += spec.nbytes
    return n


def fill(target, h: Tensor) -> None:
    """Give a pending tensor (or the storage of one's shallow copies) its host value; the host
    storage is counted as device memory from now on (``memory``: pending outputs are not
    allocated before their region runs)."""
    st = h.untyped_storage()
    is_tensor = isinstance(target, Tensor)
    memory.track(st)
    if is_tensor:
        if target.__dict__.get("_d", 0) is None:
            tensor_data.fill(target, h)
    elif tensor_data.storage_is_pending(target):   # only a storage survives (autograd's saved
        tensor_data.bind(target, st)               # copy)


def live_outputs_py(records: list) -> set:
    """{(op, output)} whose pending tensor (or its storage) is still alive. The storage decides:
    a live tensor keeps its storage (and PyTorch its one Python object) alive, and a storage
    outlives its tensor only through a C++ shallow copy, which needs the value too.
    ``live_outputs`` is its C implementation (csrc/record.cpp) where the extension is built."""
    return {(i, k) for i, rec in enumerate(records) for k, pair in enumerate(rec.outs)
            if pair is not None and pair[1]() is not None}


live_outputs = core.implementation("live_outputs", live_outputs_py)
