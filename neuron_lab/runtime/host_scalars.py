"""CPU scalar tensors as arguments of deferred ops: taken as a device copy made at the call.

PyTorch lets a 0-dim CPU tensor (``torch.tensor(0.5)``, a CPU step counter, a learning rate
kept as a tensor) be an operand of an op on another device, as a "CPU scalar": ``x * s`` with
``x`` on neuron. The engine cannot queue a CPU tensor as it is: its value is read when the
region runs, and the user may change it before (``s += 1``). It used to end the segment there
("host-arg") and run the op per-op, so a loop with such an operand never fused (10 ``x * s``
steps: 41 per-op launches and 1 fused a step, 14 us an op against 3.5 with a Python float).

Here such an argument is copied to the device when the op is called: the copy is what the op
reads, now or when its region runs, so the op sees the value of its call, as in eager mode.
The copy keeps the tensor's dtype and 0 dimensions, so type promotion is the same as with the
CPU tensor (a 0-dim tensor, not a Python number: ``int8 * tensor(2.5, dtype=float64)`` promotes
differently from ``int8 * 2.5``), and the host kernel receives the same value. Only what the
device can hold is copied (not float64 or complex: ``dtypes.HOST_ONLY``, still a boundary), and
only top-level positional and keyword arguments the op only reads: a list holding a CPU
tensor stays a boundary, and the tensor an op writes or views (``s.add_(x)``, ``out=s``) stays
the user's (the device refuses it, as CUDA does).
Autograd is not involved: the engine runs below it, and autograd saved the user's tensor.
"""
from __future__ import annotations

import torch

from ..device import memory, tensor_data
from ..device.dtypes import HOST_ONLY
from ..device.executor import host_device

Tensor = torch.Tensor


def _is_cpu_scalar(a) -> bool:
    return isinstance(a, Tensor) and a.is_cpu and a.dim() == 0 and a.dtype not in HOST_ONLY


def _on_device(a: Tensor, name: str) -> Tensor:
    """A neuron tensor holding a copy of CPU scalar ``a``'s value now."""
    h = a.detach().to(host_device(), copy=True)
    hs = h.untyped_storage()
    memory.track(hs, name)
    return tensor_data.wrap(h, hs)


def _kept(f) -> frozenset:
    """Positions and keyword names of ``f``'s arguments that it writes or returns a view of
    (``add_``'s self, ``out=``): those stay the user's tensor (a CPU one is then refused, as on
    CUDA, instead of a copy being written)."""
    kept = _KEPT.get(f)
    if kept is None:
        kept = _KEPT[f] = frozenset(f.mutates) | f.written_kw | frozenset(
            r[0] for r in f.ret_alias if r is not None)
    return kept


_KEPT: dict = {}


def copied(f, args: tuple, kwargs: dict | None):
    """(args, kwargs) of op ``f`` (its OpFacts) with every CPU scalar it only reads replaced by
    a device copy, or None when there is none (the call cannot be queued for another reason).
    The engine calls it where a call's key cannot be built (``Engine._adaptive``, deferral.cpp)."""
    kept = _kept(f)
    new_args = tuple(_on_device(a, f.name) if _is_cpu_scalar(a) and i not in kept else a
                     for i, a in enumerate(args))
    new_kwargs = kwargs
    if kwargs:
        new_kwargs = {k: _on_device(v, f.name) if _is_cpu_scalar(v) and k not in kept else v
                      for k, v in kwargs.items()}
    if all(a is b for a, b in zip(new_args, args)) and (
            not kwargs or all(new_kwargs[k] is v for k, v in kwargs.items())):
        return None
    return new_args, new_kwargs
