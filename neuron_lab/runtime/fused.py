"""The fused launch: gather a region's inputs, call its compiled program, fill the outputs.

``compiler.Plan`` says where each program input comes from (op index, argument path), the
aliasing pattern of the inputs at compile time, and which (op, output) pairs the program
returns. A launch whose inputs alias differently, or that needs a live value the program does
not return, cannot use the program (``run`` returns None; the policy replays per-op).

Outputs come back in eager's layout. Inductor may lay a graph output out its own way (a ``cat``
of an empty KV cache and a transposed key, Transformers' ``DynamicCache.update``, came back
with the key's strides where eager's ``cat`` is contiguous), but the pending shell was made with
eager's strides (the op's ``OutMeta``) and everything downstream reads them: the key of a region
taking the tensor as input, the views other Python objects rebuild on its storage, a later
program's input guards. At a program's first launch ``misplaced`` finds the outputs it lays out
otherwise; those are copied into eager's layout at every launch (``relaid``).
"""
from __future__ import annotations

import time

import torch

from ..device import shell
from . import native
from .compiler import Plan, arg_at, packed_scalars, scalar_values
from .pending import alive, fill


class FloatsChanged(Exception):
    """A program specialized on constant floats (``compiler.Specialized.chosen``) met a launch
    whose floats differ: the policy compiles the region again with its floats as data."""


def host_inputs_py(occurrences: tuple, pattern: tuple, records: list, host) -> list | None:
    """Each distinct tensor at the plan's argument paths, in order, as ``host`` (shell.host)
    gives it; None if the tensors alias otherwise than ``pattern`` (the compile-time slots).
    ``host_inputs`` is its C twin (csrc/records.cpp): ~2.5 us of Python per input, 0.3 ms per
    W6 step for its ~110 inputs."""
    slots: dict[int, int] = {}
    inputs = []
    for (i, path), want in zip(occurrences, pattern):
        t = arg_at(records[i], path)
        got = slots.setdefault(id(t), len(slots))
        if got != want:
            return None
        if got == len(inputs):
            inputs.append(host(t))
    return inputs


host_inputs = native.twin("host_inputs", host_inputs_py)


def gather_inputs(plan: Plan, records: list, packed=None) -> list | None:
    """The host tensors to call the program with, or None if the aliasing pattern differs.
    ``packed``: the scalars input to use instead of packing this launch's floats."""
    inputs = host_inputs(plan.occurrences, plan.pattern, records, shell.host)
    if inputs is None:
        return None
    if plan.scalars:
        inputs.insert(0, packed if packed is not None else packed_scalars(plan.scalars, records))
    return inputs


def launch_inputs(program, plan: Plan, records: list) -> list | None:
    """``gather_inputs``; for a program compiled with specialized floats
    (``compiler.Specialized``), only if this launch's floats are the ones it was compiled with
    (the guard; see ``compiler``'s header): else FloatsChanged (specialized by choice) or None."""
    fixed = getattr(program, "fixed", None)
    if fixed is None:
        return gather_inputs(plan, records)
    if scalar_values(plan.scalars, records) != fixed:
        if program.chosen:
            raise FloatsChanged
        return None
    return gather_inputs(plan, records, program.packed)


def _addresses_data(size, stride_a, stride_b) -> bool:
    """Do strides ``a`` and ``b`` differ in a dimension that addresses data (size > 1)?"""
    return any(n > 1 and x != y for n, x, y in zip(size, stride_a, stride_b))


def misplaced(outputs: tuple, metas: list, outs) -> tuple:
    """``((position, OutMeta), ...)``: the program's outputs whose layout differs from eager's
    (their op's OutMeta) in strides or offset. Size-1 dimensions and empty tensors address no
    data by their strides, so they do not count."""
    found = []
    for j, ((i, k), h) in enumerate(zip(outputs, outs)):
        m = metas[i][k]
        if m is None or not h.numel():
            continue
        if h.storage_offset() != m.offset or _addresses_data(m.size, h.stride(), m.stride):
            found.append((j, m))
    return tuple(found)


def relaid(h, m):
    """``h``'s values in a new host tensor laid out as ``m`` (size, stride, offset). Dimensions
    eager broadcasts (stride 0) are written once; a layout whose elements overlap otherwise
    (``unfold``-like) keeps ``h``."""
    span = 1 + sum((n - 1) * s for n, s in zip(m.size, m.stride))
    out = torch.empty(m.offset + span, dtype=h.dtype, device=h.device)
    out = out.as_strided(m.size, m.stride, m.offset)
    dst, src = out, h
    for d, s in enumerate(m.stride):
        if s == 0 and m.size[d] > 1:
            dst, src = dst.narrow(d, 0, 1), src.narrow(d, 0, 1)
    if torch._debug_has_internal_overlap(dst) != 0:
        return h
    dst.copy_(src)
    return out


def run(region, records: list, needed: set) -> float | None:
    """Run the region's program; host seconds, or None if this launch cannot use it."""
    plan = region.plan
    if not needed.issubset(plan.outputs_set):
        return None
    inputs = launch_inputs(region.program, plan, records)
    if inputs is None:
        return None
    t0 = time.perf_counter()
    program = region.program
    outs = program(*inputs)
    checked = region.relayout
    if checked is None or checked[0] is not program:      # its first launch
        checked = region.relayout = (program, misplaced(plan.outputs, region.metas, outs))
    if checked[1]:
        outs = list(outs)
        for j, m in checked[1]:
            outs[j] = relaid(outs[j], m)
    dt = time.perf_counter() - t0
    for (i, k), h in zip(plan.outputs, outs):
        pair = records[i].outs[k]
        tgt = alive(pair) if pair is not None else None
        if tgt is not None:
            fill(tgt, h)
    return dt
