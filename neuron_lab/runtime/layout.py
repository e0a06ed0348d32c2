"""Host tensors in a given layout (size, stride, storage offset).

A neuron tensor carries eager's layout (its op's ``OutMeta``) and its host value must
have the same one: the region key of a later region reading it, the views other Python objects
rebuild on its storage and a fused program's input guards all read the device tensor. Fused programs
do not always give it (see ``fused``); example inputs for a compile must have it exactly, also
when eager's layout overlaps (an ``expand``ed input: stride 0).
"""
from __future__ import annotations

import torch

Tensor = torch.Tensor


def addresses_data(size, stride_a, stride_b) -> bool:
    """Do strides ``a`` and ``b`` differ in a dimension that addresses data (size > 1)?"""
    return any(n > 1 and x != y for n, x, y in zip(size, stride_a, stride_b))


def misplaced(outputs: tuple, metas: list, outs) -> tuple:
    """``((position, OutMeta), ...)``: the outputs ``outs`` of a program returning the
    ``(op, output)`` pairs ``outputs`` whose layout differs from eager's (``metas[op][output]``)
    in strides or offset. Size-1 dimensions and empty tensors address no data by their strides,
    so they do not count."""
    found = []
    for j, ((i, k), h) in enumerate(zip(outputs, outs)):
        m = metas[i][k]
        if m is None or not h.numel():
            continue
        if h.storage_offset() != m.offset or addresses_data(m.size, h.stride(), m.stride):
            found.append((j, m))
    return tuple(found)


def strided_copy(h: Tensor, size, stride, offset: int) -> Tensor | None:
    """A new host tensor laid out as (size, stride, offset) holding ``h``'s values, on a storage
    of its own. Dimensions broadcast in the layout (stride 0) are written once; a layout whose
    elements overlap otherwise (``unfold``-like) cannot be written: None."""
    span = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0
    out = torch.empty(offset + span, dtype=h.dtype, device=h.device)
    out = out.as_strided(size, stride, offset)
    dst, src = out, h
    for d, s in enumerate(stride):
        if s == 0 and size[d] > 1:
            dst, src = dst.narrow(d, 0, 1), src.narrow(d, 0, 1)
    if torch._debug_has_internal_overlap(dst) != 0:
        return None
    dst.copy_(src)
    return out
