"""Per-op replay of a deferred region: each record's op runs on host tensors, in order.

No dispatcher round trip through the device kernel: arguments were checked when the op was
recorded. Each output still alive receives its value (``pending.fill``). The loop runs in C
where the runtime's extension is built (``replay``, csrc/replay.cpp; ``replay_py`` is the
reference). The fused launch is ``fused.py``'s.
"""
from __future__ import annotations

import time

import torch

from ..device import tensor_data
from ..device.executor import host_device
from . import core
from .pending import alive, fill
from .record import Ref, flatten_outputs

Tensor = torch.Tensor


def _resolve(a, vals, env):
    host, ref_type, device_type, host_device_ = env
    if type(a) is ref_type:
        return vals[a.pos][a.k]
    if isinstance(a, Tensor):
        return host(a)
    if type(a) is list or type(a) is tuple:
        return type(a)(_resolve(x, vals, env) for x in a)
    if type(a) is device_type and a.type == "neuron":
        return host_device_()
    return a


def _reads(a, ref_type):
    """The positions of the Refs in argument ``a``."""
    if type(a) is ref_type:
        yield a.pos
    elif type(a) is list or type(a) is tuple:
        for x in a:
            yield from _reads(x, ref_type)


def freed_after(records: list, ref_type) -> list[list[int]]:
    """For each op, the ops whose host outputs no later op reads once it has run (an op no
    one reads: right after itself). Letting them go there is what eager does with an
    intermediate; holding all of them to the end would keep every intermediate of a region
    alive at once, raising the replay's peak memory above eager's."""
    last = list(range(len(records)))
    for i, rec in enumerate(records):
        for a in (*rec.args, *(rec.kwargs.values() if rec.kwargs else ())):
            for j in _reads(a, ref_type):
                last[j] = i
    out: list[list[int]] = [[] for _ in records]
    for j, i in enumerate(last):
        out[i].append(j)
    return out


def run_one(rec, vals, env, fill_) -> list:
    """Run record ``rec``'s op on host values (``env``: ``_resolve``'s, its Refs read from
    ``vals``), ``fill_`` each of its outputs still alive; returns its host outputs."""
    args = [_resolve(a, vals, env) for a in rec.args]
    kwargs = {k: _resolve(v, vals, env) for k, v in rec.kwargs.items()} if rec.kwargs else {}
    houts = flatten_outputs(rec.facts.call(*args, **kwargs))
    for k, pair in enumerate(rec.outs):
        if pair is not None and k < len(houts) and houts[k] is not None:
            tgt = alive(pair)
            if tgt is not None:
                fill_(tgt, houts[k])
    return houts


def replay_py(records: list, host, fill_, ref_type, device_type, host_device_) -> None:
    """Run ``records`` one op at a time on host values (``host``: a device tensor's, a Ref of
    ``ref_type``: an earlier output's, a ``device_type`` "neuron": ``host_device_()``),
    ``fill_`` each output still alive, and let each op's host outputs go after the last op
    reading them (``freed_after``). ``replay`` is its C implementation (csrc/replay.cpp) where the
    runtime's extension is built: ~2 us less per op."""
    env = (host, ref_type, device_type, host_device_)
    frees = freed_after(records, ref_type)
    vals: list[list | None] = []
    for i, rec in enumerate(records):
        try:
            vals.append(run_one(rec, vals, env, fill_))
        except Exception as e:
            e.neuron_lab_failed = (i, rec)       # which deferred op: the engine explains it
            raise
        for j in frees[i]:
            vals[j] = None


replay = core.implementation("replay", replay_py)


def per_op(records: list) -> float:
    """Replay ``records`` one op at a time on the host; returns host seconds."""
    t0 = time.perf_counter()
    replay(records, tensor_data.host_now, fill, Ref, torch.device, host_device)
    return time.perf_counter() - t0
