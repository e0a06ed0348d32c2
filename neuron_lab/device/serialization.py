"""Saving and loading ``neuron`` tensors, and storages made directly on the device.

1. ``torch.load(map_location='neuron')``: restoring a storage onto the device (``install``)
   and ``set_`` onto a neuron storage (``transfers.set_storage``); a callable ``map_location``
   for a neuron checkpoint.
2. ``torch.UntypedStorage(n, device='neuron')`` needs a C++ allocator (``storage``).
"""
from __future__ import annotations

import torch

from . import kernels


def install() -> None:
    """``torch.load(map_location='neuron')`` restores CPU storages onto the device: PyTorch's own
    path copies bytes into a device storage in C++, which has no bytes here. This restore
    function gives it a neuron storage backed by a host copy instead."""
    from . import memory, tensor_data
    from .executor import host_device

    def restore(obj, location):
        if not str(location).startswith("neuron"):
            return None
        dev = torch.device(location)
        if dev.index not in (None, 0):
            raise kernels.bad_index(dev)
        # The loader's fresh CPU storage becomes the device's bytes (a copy only for the CUDA
        # executor); no device op runs, so nothing is queued by the adaptive runtime.
        return _onto_device(obj if host_device().type == "cpu" else obj.to(device=host_device()))

    def _onto_device(hs):
        memory.track(hs, "torch.load")
        # a fresh output's 0-byte storage: torch.load reads its data_ptr(), which raises on
        # a null storage that claims bytes; set_ onto it finds the bytes through ``_h``
        return tensor_data.wrap(torch.empty(0, dtype=torch.uint8, device=hs.device).set_(hs)) \
            .untyped_storage()

    orig_to = torch.storage._to

    def _to(self, device, non_blocking=False):   # storage.to(device='neuron'), e.g. in a
        device = torch.device(device)            # callable map_location
        if device.type != "neuron" or self.device == device:
            return orig_to(self, device, non_blocking)
        if device.index not in (None, 0):
            raise kernels.bad_index(device)
        hs = torch.UntypedStorage(self.nbytes(), device=host_device())
        return _onto_device(hs.copy_(self))

    torch.storage._to = _to

    torch.serialization.register_package(5, lambda obj: None, restore)

    # Loading a *neuron* checkpoint with a callable map_location (``lambda s, loc: s``, the old
    # "load on CPU" idiom): PyTorch's rebuild for storage-less backends raises "Callable
    # map_location not supported". Ask the callable where it puts a (empty) storage instead.
    utils = torch._utils
    orig = utils._get_restore_location

    def _get_restore_location(device):
        ml = torch.serialization._serialization_tls.map_location
        if callable(ml) and not isinstance(ml, (str, torch.device)):
            placed = ml(torch.UntypedStorage(0), device)
            return getattr(placed, "device", device)
        return orig(device)

    utils._get_restore_location = _get_restore_location


def storage() -> None:
    """``torch.UntypedStorage(n, device='neuron')`` (also reached by ``storage.to(device=...)``
    and ``TypedStorage(..., device=...)``) asks C++ for the PrivateUse1 allocator, which a
    Python backend does not have: it segfaulted. Build the storage from host bytes instead."""
    from . import memory, tensor_data
    from .executor import host_device

    U = torch.UntypedStorage
    orig_new = U.__new__

    def __new__(cls, *args, device=None, **kwargs):
        if device is None or torch.device(device).type != "neuron":
            return orig_new(cls, *args, **kwargs) if device is None else \
                orig_new(cls, *args, device=device, **kwargs)
        dev = torch.device(device)
        if dev.index not in (None, 0):
            raise kernels.bad_index(dev)
        hs = orig_new(cls, *args, device=host_device(), **kwargs)
        memory.track(hs, "UntypedStorage")
        return tensor_data.storage_for(hs)

    U.__new__ = __new__
