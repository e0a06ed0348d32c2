"""PyTorch's PrivateUse1 hooks for ``neuron``: pinned memory and generators (``csrc/hooks.cpp``).

The Python hooks that ``_setup_privateuseone_for_python_backend`` can register answer only
"is it available/built"; pinned memory (``DataLoader(pin_memory=True)``, ``Tensor.pin_memory()``,
``is_pinned()``, a ``non_blocking`` copy to the host) and device generators
(``torch.Generator(device="neuron")``) are asked of the C++ hooks object, so the device registers
a C++ one, as PyTorch's reference PrivateUse1 backend (OpenReg) does. PyTorch takes one hooks
object per process: ``install`` registers it before any other.

A neuron generator fronts a host generator (random ops run on the host executor): its seed,
state and offset are the host generator's; ``host_generators`` swaps it in for the host op.
"""
from __future__ import annotations

import torch

from . import executor, memory, runtime_interface, tensor_data

_ext = None


def _host_generator(default: bool) -> torch.Generator:
    dev = executor.host_device()
    if default:
        return torch.cuda.default_generators[0] if dev.type == "cuda" else torch.default_generator
    return torch.Generator(device=dev)


def install(ext) -> None:
    """Register the C++ hooks of ``ext`` (the device's native extension)."""
    global _ext
    ext.install_hooks(_host_generator, executor.host_device().type == "cuda", resize_storage)
    _ext = ext


def resize_storage(st: torch.UntypedStorage, nbytes: int) -> None:
    """``untyped_storage().resize_(nbytes)`` on a neuron storage (the C++ hook calls this).

    FSDP2 frees an unsharded parameter's bytes with ``resize_(0)`` after use and re-allocates
    them with ``resize_(n)`` before the next all-gather writes into them; every tensor viewing
    the storage stays valid. Queued work runs first (it may read or write these bytes); the host
    storage is resized in place, so every host view follows; growth past the modelled HBM
    raises ``OutOfMemoryError`` before anything changes."""
    runtime_interface.flush("storage-resize")
    h = tensor_data.host_storage(st, None)
    if h is None:
        raise RuntimeError(
            f"neuron: UntypedStorage.resize_({nbytes}) on device neuron:0: this storage has no "
            "device data (it was not created by neuron_lab); make it with "
            "torch.UntypedStorage(n, device='neuron') or from a neuron tensor")
    old = memory.counted_bytes(h)
    if old is not None and nbytes > old:
        memory.check(nbytes - old, "UntypedStorage.resize_")
    h.resize_(nbytes)
    tensor_data.bind(st, h)
    memory.retrack(h)


def pin_device_tensor(self, device=None):
    """``aten::_pin_memory`` on a neuron tensor: only host tensors are pinned (as for CUDA)."""
    raise RuntimeError(
        f"cannot pin a tensor on {self.device}: only dense CPU tensors can be pinned (pinned "
        f"memory is host memory for fast copies to the device); pin the CPU tensor before "
        f"moving it: x.pin_memory().to('neuron', non_blocking=True)")


def is_pinned_device_tensor(self, device=None) -> bool:
    """``aten::is_pinned`` on a neuron tensor: device memory is never pinned host memory."""
    return False


def host_generator(g: torch.Generator, op: str = "a random op") -> torch.Generator:
    """The host generator a neuron generator draws from. A generator of another device is
    refused, as CUDA refuses a CPU generator for a CUDA op."""
    if g.device.type != "neuron":
        raise RuntimeError(
            f"Expected a 'neuron' device type for generator but found '{g.device.type}' (in {op} "
            f"on neuron:0). Create it with torch.Generator(device='neuron'), or draw on "
            f"{g.device.type} and move the result with .to('neuron').")
    return _ext.host_generator(g)


def host_generators(op: str, args, kwargs):
    """``args``/``kwargs`` of random op ``op`` with its neuron generator replaced by its host one."""
    G = torch.Generator
    if any(type(a) is G for a in args):
        args = [host_generator(a, op) if type(a) is G else a for a in args]
    g = kwargs.get("generator") if kwargs else None
    if g is not None:
        kwargs = dict(kwargs, generator=host_generator(g, op))
    return args, kwargs
