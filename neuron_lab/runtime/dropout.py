"""Dropout inside a region: its random mask drawn at the call, the rest of it queued.

A random op cannot be deferred as it is: its draws would happen when its region runs, after
whatever else drew from the host generator in between (a CPU ``randperm``, a data loader, a
``manual_seed``), and differ from eager's. So every ``native_dropout`` of a training step ended
its segment ("rng"): BART's step in the model zoo was cut 12 times, T5's 24.

Dropout's draws depend on its input's shape only, not on its values. ``queued`` computes it the
way the host kernel does (ATen's ``native_dropout_cpu``: a bool mask shaped like the input,
``bernoulli_(1 - p)``, then ``input.mul(mask).mul_(scale)``), draws the mask now, on the host
generator, where eager draws it (a host fallback, recorded as eager's is), and queues the two
products: the same draws in the same order as eager's and the same arithmetic, so per-op replay
is bitwise eager's, and a fused program computes the products with the mask as a region input.
Backward (``native_dropout_backward``) reads the mask and draws nothing. Only where the host
executor is the CPU (a CUDA executor draws on its own generator) and for a contiguous input
(the mask gets its strides, as ``empty_like`` gives them); any other call stays a boundary.
"""
from __future__ import annotations

import torch

from ..device import memory, tensor_data, tracking
from ..device.executor import host_device
from ..device.kernels import RANDOM_ON_HOST

_mul = torch.ops.aten.mul.Tensor


def takes(f, args, kwargs) -> bool:
    """Is this call one ``queued`` computes? (Else it ends the segment and runs now.)"""
    if f.base != "native_dropout" or host_device().type != "cpu":
        return False
    x, _, train = _arguments(args, kwargs)
    return train is not False and x.numel() != 0 and x.is_contiguous()


def queued(f, args, kwargs):
    """``native_dropout``'s (output, mask) of a call ``takes``: the mask drawn now, the
    products queued."""
    x, p, _ = _arguments(args, kwargs)
    p1m = 1.0 - p
    scale = 0.0 if p1m == 0 else 1.0 / p1m
    h = torch.empty_strided(x.shape, x.stride(), dtype=torch.bool, device="cpu")  # empty_like
    h.bernoulli_(p1m)
    tracking.record_fallback(f.name, RANDOM_ON_HOST)     # as the eager kernel records it
    hs = h.untyped_storage()
    memory.track(hs, f.name)
    mask = tensor_data.wrap(h, hs)
    return _mul(x, mask).mul_(scale), mask


def _arguments(args, kwargs):
    kw = kwargs or {}
    x = args[0] if args else kw["input"]
    p = args[1] if len(args) > 1 else kw["p"]
    train = args[2] if len(args) > 2 else kw.get("train")
    return x, float(p), train
