"""Per-op replay of a deferred region: each record's op runs on host tensors, in order.

No dispatcher round trip through the device kernel: arguments were checked when the op was
recorded. Each output still alive receives its value (``pending.fill``). The loop runs in C
where the runtime's extension is built (``replay``, csrc/replay.cpp; ``replay_py`` is the
reference). The fused launch is ``fused.py``'s.
"""
from __future__ import annotations

import time

import torch

from ..device import shell
from ..device.executor import host_device
from . import native
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


def replay_py(records: list, host, fill_, ref_type, device_type, host_device_) -> None:
    """Run ``records`` one op at a time on host values (``host``: a device tensor's, a Ref of
    ``ref_type``: an earlier output's, a ``device_type`` "neuron": ``host_device_()``),
    ``fill_`` each output still alive. ``replay`` is its C twin (csrc/replay.cpp) where the
    runtime's extension is built: ~2 us less per op."""
    env = (host, ref_type, device_type, host_device_)
    vals: list[list] = []
    for i, rec in enumerate(records):
        args = [_resolve(a, vals, env) for a in rec.args]
        kwargs = ({k: _resolve(v, vals, env) for k, v in rec.kwargs.items()} if rec.kwargs
                  else {})
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
                    fill_(tgt, houts[k])


replay = native.twin("replay", replay_py)


def per_op(records: list) -> float:
    """Replay ``records`` one op at a time on the host; returns host seconds."""
    t0 = time.perf_counter()
    replay(records, shell.host, fill, Ref, torch.device, host_device)
    return time.perf_counter() - t0
