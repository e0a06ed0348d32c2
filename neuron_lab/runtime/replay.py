"""Running a deferred region: per-op replay or the fused program, then filling pending tensors.

Per-op replay runs each record's op directly on host tensors (no dispatcher round trip through
the device kernel: arguments were checked when the op was recorded). The fused path gathers the
region's inputs, calls the compiled program, and fills the outputs it returns. Either way every
pending tensor still alive receives its value; dead ones are skipped (a fused program does not
even compute them).
"""
from __future__ import annotations

import time

import torch

from ..device import memory, shell
from ..device.executor import host_device
from . import compiler
from .record import Ref, flatten_outputs

Tensor = torch.Tensor


def alive(ref_pair) -> Tensor | None:
    """The pending tensor behind (tensor weakref, storage weakref), or a live alias of its storage."""
    if ref_pair is None:
        return None
    t = ref_pair[0]()
    if t is not None:
        return t
    st = ref_pair[1]() if ref_pair[1] is not None else None
    return st


def _fill(target, h: Tensor) -> None:
    """Give a pending shell (or the storage of one's shallow copies) its host value."""
    st = h.untyped_storage()
    is_tensor = isinstance(target, Tensor)
    memory.settle(target.untyped_storage() if is_tensor else target, st)
    if is_tensor:
        if target.__dict__.get("_d", 0) is None:
            shell.fill(target, h)
    elif getattr(target, "_h", 0) is None:   # only a storage survives (autograd's saved copy)
        shell.bind(target, st)


def _resolve(a, vals):
    if type(a) is Ref:
        return vals[a.pos][a.k]
    if isinstance(a, Tensor):
        return shell.host(a)
    if type(a) is list or type(a) is tuple:
        return type(a)(_resolve(x, vals) for x in a)
    if type(a) is torch.device and a.type == "neuron":
        return host_device()
    return a


def per_op(records: list) -> float:
    """Replay ``records`` one op at a time on the host; returns host seconds."""
    t0 = time.perf_counter()
    vals: list[list] = []
    for i, rec in enumerate(records):
        args = [_resolve(a, vals) for a in rec.args]
        kwargs = {k: _resolve(v, vals) for k, v in rec.kwargs.items()} if rec.kwargs else {}
        try:
            houts = flatten_outputs(rec.facts.call(*args, **kwargs))
        except Exception as e:
            e.neuron_lab_failed = (i, rec)       # which deferred op: the engine explains it
            raise
        vals.append(houts)
        for k, pair in enumerate(rec.outs):
            if pair is not None and k < len(houts) and houts[k] is not None:
                tgt = alive(pair)
                if tgt is not None:
                    _fill(tgt, houts[k])
    return time.perf_counter() - t0


def live_outputs(records: list) -> set:
    """{(op, output)} whose pending tensor (or its storage) is still alive."""
    return {(i, k) for i, rec in enumerate(records) for k, pair in enumerate(rec.outs)
            if pair is not None and alive(pair) is not None}


def fused(region, records: list, needed: set) -> float | None:
    """Run the region's program; None if this launch cannot use it (inputs alias differently,
    or a live value the program does not return)."""
    plan = region.plan
    if not needed.issubset(plan.outputs_set):
        return None
    inputs = compiler.launch_inputs(region.program, plan, records)
    if inputs is None:
        return None
    t0 = time.perf_counter()
    outs = region.program(*inputs)
    dt = time.perf_counter() - t0
    for (i, k), h in zip(plan.outputs, outs):
        pair = records[i].outs[k]
        tgt = alive(pair) if pair is not None else None
        if tgt is not None:
            _fill(tgt, h)
    return dt
