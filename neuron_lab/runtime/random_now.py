"""Random factories inside a segment: drawn at the call, and the segment goes on.

A random op is never deferred: its draws must happen where eager's do, on the host generator,
in the program's order (a CPU ``randperm`` or a ``manual_seed`` between the call and the
region's launch would otherwise see other numbers). So it ended its segment ("rng"), and a
training step that draws every iteration — a diffusion model's noise, a VAE's
``randn_like(std)``, an augmentation mask — was cut into two regions at each draw, with a launch
between.

An op that draws and reads no tensor's value needs nothing of the queue, though: a factory
(``torch.randn(shape)``, ``rand``, ``randint``, ``randperm``, ``normal`` of two floats) or a
``*_like``, which reads its input's metadata only. ``arguments`` names those calls; the engine
runs them at once, as eager mode runs them (the same draws, the same host fallback record),
without running what is queued, and the output enters the segment as a region input. A
``*_like`` of a pending tensor (its value not computed yet) runs on a stand-in with the same
metadata and no value. An op writing an argument (``normal_``, ``uniform_``, ``bernoulli_``,
``out=``) or reading values (``bernoulli(p)``, ``multinomial``, ``poisson``,
``normal(mean_tensor)``) still ends the segment: a queued op may read the tensor it writes, or
write the one it reads. Dropout has its own path (``dropout.py``).
"""
from __future__ import annotations

import torch

from ..device import tensor_data
from ..device.executor import host_device

Tensor = torch.Tensor


def arguments(f, args, kwargs):
    """(args, kwargs) to run random op ``f`` with at the call, ops still queued, with eager's
    draws and values; None where it must end the segment instead."""
    if f.mutates or f.written_kw:
        return None
    like = f.base.endswith("_like")
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            if not (like and i == 0) or a.device.type != "neuron":
                return None
        elif type(a) in (list, tuple) and any(isinstance(x, Tensor) for x in a):
            return None
    if kwargs and any(isinstance(v, (Tensor, list, tuple)) for v in kwargs.values()):
        return None
    if like and tensor_data.is_pending(args[0]):
        args = (_stand_in(args[0]), *args[1:])
    return args, kwargs


def _stand_in(t: Tensor) -> Tensor:
    """A device tensor with ``t``'s sizes, strides and dtype and no value: all a ``*_like``
    reads (its output gets ``t``'s layout where ``t`` is dense, as ``empty_like`` decides)."""
    return tensor_data.wrap(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                          device=host_device()))
