"""The fused launch: gather a region's inputs, call its compiled program, fill the outputs.

``compiler.Plan`` says where each program input comes from (op index, argument path), the
aliasing pattern of the inputs at compile time, and which (op, output) pairs the program
returns. A launch whose inputs alias differently cannot use the program (``run`` returns None;
the policy replays per-op); one that needs a live value the program does not return never
reaches ``run`` (the policy compiles the region again, its rule 7).

Outputs come back in eager's layout. Inductor may lay a graph output out its own way (a ``cat``
of an empty KV cache and a transposed key, Transformers' ``DynamicCache.update``, came back
with the key's strides where eager's ``cat`` is contiguous), but the pending tensor was made with
eager's strides (the op's ``OutMeta``) and everything downstream reads them: the key of a region
taking the tensor as input, the views other Python objects rebuild on its storage, a later
program's input guards. At a program's first launch ``layout.misplaced`` finds the outputs it
lays out otherwise; those are copied into eager's layout at every launch (``relaid``).
"""
from __future__ import annotations

import time

from ..device import tensor_data
from . import core, knobs
from .compiler import Plan, arg_at, packed_scalars, scalar_values
from .layout import misplaced, strided_copy
from .pending import alive, fill


class FloatsChanged(Exception):
    """A program specialized on constant floats (``programs.Specialized.chosen``) met a launch
    whose floats differ: the policy compiles the region again with its floats as data."""


def host_inputs_py(occurrences: tuple, pattern: tuple, records: list, host) -> list | None:
    """Each distinct tensor at the plan's argument paths, in order, as ``host``
    (tensor_data.host_now) gives it; None if the tensors alias otherwise than ``pattern`` (the
    compile-time slots). ``host_inputs`` is its C implementation (csrc/record.cpp): this loop costs
    microseconds of Python per input, on every launch."""
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


host_inputs = core.implementation("host_inputs", host_inputs_py)


def held_call_py(program, inputs: list):
    """``program(*inputs)``. Its C implementation (csrc/held_call.cpp) holds a C++ reference on every input
    tensor for the call, so a program that runs without the GIL (inductor's C++ wrapper) frees
    its input handles without waiting for the GIL (the C file's header says why)."""
    return program(*inputs)


held_call = core.implementation("held_call", held_call_py)


def gather_inputs(plan: Plan, records: list, packed=None) -> list | None:
    """The host tensors to call the program with, or None if the aliasing pattern differs.
    ``packed``: the scalars input to use instead of packing this launch's floats."""
    inputs = host_inputs(plan.occurrences, plan.pattern, records, tensor_data.host_now)
    if inputs is None:
        return None
    if plan.scalars:
        inputs.insert(0, packed if packed is not None else packed_scalars(plan.scalars, records))
    return inputs


def launch_inputs(program, plan: Plan, records: list) -> list | None:
    """``gather_inputs``; for a program compiled with specialized floats
    (``programs.Specialized``), only if this launch's floats are the ones it was compiled with
    (the guard; see ``compiler``'s header): else FloatsChanged (specialized by choice) or None."""
    fixed = getattr(program, "fixed", None)
    if fixed is None:
        return gather_inputs(plan, records)
    if scalar_values(plan.scalars, records) != fixed:
        if program.chosen:
            raise FloatsChanged
        return None
    return gather_inputs(plan, records, program.packed)


def relaid(h, m):
    """``h``'s values in eager's layout ``m`` (an OutMeta); ``h`` itself where that layout
    cannot be written (``layout.strided_copy``)."""
    out = strided_copy(h, m.size, m.stride, m.offset)
    return h if out is None else out


def run(region, records: list) -> float | None:
    """Run the region's program; host seconds, or None if this launch cannot use it."""
    plan = region.plan
    program = region.program    # read once: the inputs (a specialized program's floats) are its
    inputs = launch_inputs(program, plan, records)
    if inputs is None:
        return None
    t0 = time.perf_counter()
    outs = held_call(program, inputs)
    checked = region.relayout
    if checked is None or checked[0] is not program:      # its first launch
        checked = region.relayout = (program, misplaced(plan.outputs, region.metas, outs))
        if checked[1] and knobs.DEBUG_LEVEL():
            print(f"[neuron_lab] region {region.id}: its program lays out "
                  f"{len(checked[1])} output(s) unlike eager; copied at each launch", flush=True)
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
