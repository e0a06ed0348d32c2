"""The boundary a compiled graph's call crosses: neuron tensors in, neuron tensors out.

A ``neuron`` tensor's bytes live in a host storage (``device/tensor_data.py``), so the compiled host
program reads and writes them directly: each input is replaced by its host view (in adaptive
mode a still-deferred input is computed first — a region boundary, as for any host read), the
program runs, and each output storage the device has not seen yet is counted in
``memory_allocated()`` and checked against the capacity (``torch.OutOfMemoryError`` naming the
graph, raised before any result escapes, every existing tensor unchanged), then wrapped as a
new ``neuron`` tensor sharing that storage. Outputs that are views of inputs share the input's
storage, which is counted once, so aliasing and the accounting stay as in eager.
"""
from __future__ import annotations

import torch

from ..device import memory, tensor_data

Tensor = torch.Tensor
_NEURON = "neuron"


def to_host(args: list) -> list:
    out = []
    for a in args:
        if isinstance(a, Tensor) and a.device.type == _NEURON:
            a = tensor_data.host(a)
        out.append(a)
    return out


def to_device(outs, on_device, name: str):
    """Count the new storages of the host results ``outs`` that belong on the device (OOM
    first) and wrap them; outputs the graph itself put on the host (``x.cpu()``) stay there."""
    new = {}
    for h, dev in zip(outs, on_device):
        if dev and isinstance(h, Tensor):
            st = h.untyped_storage()
            if not memory.is_counted(st) and id(st) not in new:
                new[id(st)] = st
    if new:
        need = sum(s.nbytes() for s in new.values())
        memory.check(need, name)
        for st in new.values():
            memory.track(st)
    return [tensor_data.wrap(h) if dev and isinstance(h, Tensor) else h
            for h, dev in zip(outs, on_device)]


def bridged(compiled_call, on_device: list, name: str):
    """A boxed callable (list in, list out, as inductor's) over neuron tensors."""
    def call(args: list):
        hargs = to_host(args)
        args.clear()
        outs = compiled_call(hargs)
        return to_device(outs, on_device, name)

    call._boxed_call = True
    return call
