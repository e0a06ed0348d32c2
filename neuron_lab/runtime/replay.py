"""Per-op replay of a deferred region: each record's op runs on host tensors, in order.

No dispatcher round trip through the device kernel: arguments were checked when the op was
recorded. Each output still alive receives its value (``pending.fill``). The fused launch is
``fused.py``'s.
"""
from __future__ import annotations

import time

import torch

from ..device import shell
from ..device.executor import host_device
from .pending import alive, fill
from .record import Ref, flatten_outputs

Tensor = torch.Tensor


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
                    fill(tgt, houts[k])
    return time.perf_counter() - t0
