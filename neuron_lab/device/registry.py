"""Registering ``neuron`` with PyTorch through the PrivateUse1 extension point.

``_setup_privateuseone_for_python_backend`` gives the device guard and hooks that ``.to``,
``nn.Module.to`` and ``backward()`` need. It stops short in four places, patched here, each
narrowly (the patch only changes behaviour for ``neuron`` and otherwise calls PyTorch's own):

1. ``torch.accelerator.synchronize`` raises "Backend doesn't support synchronizing all streams"
   and ``torch.accelerator.memory.*`` says the allocator is not a DeviceAllocator: both are
   routed to ``torch.neuron`` when the current accelerator is ``neuron``.
2. ``torch.save``: a shell's storage holds no bytes, so ``Tensor._reduce_ex_internal`` takes the
   path PyTorch already uses for storage-less backends (copy to CPU, rebuild on load honouring
   ``map_location``).
3. ``tensor.data = other`` swaps the TensorImpl's storage in C++ without a kernel call; the
   setter also refreshes the host view cached on the Python object.
4. ``repr`` of a neuron tensor is a sync point and is counted as such.
5. ``torch.load(map_location='neuron')``: restoring a storage onto the device (see
   ``_patch_serialization``) and ``set_`` onto a neuron storage (``kernels.set_storage``).
"""
from __future__ import annotations

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from . import autocast, kernels, module, tracking
from .opinfo import facts

_registered = False
_libs: list = []


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _kernel(op):
    f = facts(op)
    execute = kernels.execute
    if f.base == "set_" and "Storage" in f.name:
        return kernels.set_storage

    def kernel(*args, **kwargs):
        launch = kernels.launcher
        if launch is None:
            return execute(f, args, kwargs)
        return launch(f, args, kwargs)

    kernel.__name__ = f"neuron_{f.base}"
    return kernel


def _fallback(op, *args, **kwargs):
    return _kernel(op)(*args, **kwargs)


def _overload(qualname: str):
    ns, rest = qualname.split("::", 1)
    name, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")


# Left to PyTorch's CompositeExplicitAutograd kernels: they shallow-copy the TensorImpl in C++
# (no Python object attached), which ``Parameter``/``_make_subclass`` requires; the copy shares
# the storage, so ``shell.host`` finds its data through the storage.
NATIVE = frozenset({"detach", "alias", "lift_fresh"})

# An op with any of these kernels gets ours. CompositeExplicitAutogradNonFunctional kernels
# (``*_scatter``, ``*_copy``, ``diag_embed``...) would otherwise run on the shells themselves and
# read the shell storage's byte size (``clone_preserve_strides``), which is 0 for fresh outputs.
BACKEND_KEYS = ("CPU", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")

SPECIAL = {"_copy_from": kernels.copy_from, "_copy_from_and_resize": kernels.copy_from_and_resize}


def _register_kernels() -> int:
    lib = torch.library.Library("aten", "IMPL")
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    n = 0
    for qualname in torch._C._dispatch_get_all_op_names():
        if not qualname.startswith("aten::"):
            continue
        # A decomposition runs unless CPU has its own kernel (silu_backward, mish_backward):
        # then CPU's kernel wins on CPU, and ours (running it) must win here, or results and
        # autograd differ from CPU's.
        if has(qualname, "CompositeImplicitAutograd") and not has(qualname, "CPU"):
            continue
        if not any(has(qualname, k) for k in BACKEND_KEYS):
            continue
        short = qualname[6:]
        base = short.split(".", 1)[0]
        if base in NATIVE:
            continue
        try:
            impl = SPECIAL.get(base) or _kernel(_overload(qualname))
            lib.impl(short, impl, "PrivateUse1")
            n += 1
        except (AttributeError, RuntimeError):
            continue
    fb = torch.library.Library("_", "IMPL")
    fb.fallback(_fallback, dispatch_key="PrivateUse1")
    _libs.extend([lib, fb])
    return n


def _patch_accelerator() -> None:
    acc = torch.accelerator
    orig_sync = acc.synchronize

    def synchronize(device=None):
        if acc.current_accelerator().type == "neuron":
            return module.synchronize(device)
        return orig_sync(device)

    acc.synchronize = synchronize
    mem = getattr(acc, "memory", None)
    if mem is None:
        return
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "memory_stats", "reset_peak_memory_stats",
                 "reset_accumulated_memory_stats", "empty_cache", "mem_get_info"):
        orig = getattr(mem, name, None)
        if orig is None:
            continue

        def routed(*a, _orig=orig, _name=name, **k):
            if acc.current_accelerator().type == "neuron":
                return getattr(module, _name)(*a, **k)
            return _orig(*a, **k)

        routed.__name__ = name
        setattr(mem, name, routed)
        if getattr(acc, name, None) is orig:
            setattr(acc, name, routed)


def _patch_tensor() -> None:
    T = torch.Tensor
    orig_reduce = T._reduce_ex_internal

    def _reduce_ex_internal(self, proto):
        if self.device.type == "neuron":
            return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                    (self.cpu(), self.dtype, str(self.device), self.requires_grad))
        return orig_reduce(self, proto)

    T._reduce_ex_internal = _reduce_ex_internal

    data = torch._C.TensorBase.data

    def _set_data(self, value):
        data.__set__(self, value)
        if self.__dict__.get("_d", 0) != 0:
            del self._d        # re-derived from the (new) storage on next use

    T.data = property(data.__get__, _set_data, doc=data.__doc__)

    orig_repr = T.__repr__

    def __repr__(self, *, tensor_contents=None):
        if self.device.type == "neuron":
            tracking.record_sync("repr")
        return orig_repr(self, tensor_contents=tensor_contents)

    T.__repr__ = __repr__


def _patch_serialization() -> None:
    """``torch.load(map_location='neuron')`` restores CPU storages onto the device: PyTorch's own
    path copies bytes into a device storage in C++, which has no bytes here. This restore
    function gives it a neuron storage backed by a host copy instead."""
    from . import shell

    def restore(obj, location):
        if not str(location).startswith("neuron"):
            return None
        dev = torch.device(location)
        if dev.index not in (None, 0):
            raise kernels.bad_index(dev)
        t = torch.empty(obj.nbytes(), dtype=torch.uint8, device="neuron")
        shell.host(t).untyped_storage().copy_(obj)
        return t.untyped_storage()

    torch.serialization.register_package(5, lambda obj: None, restore)


def register() -> None:
    """Register ``neuron`` (idempotent). Raises if another backend owns PrivateUse1."""
    global _registered
    if _registered:
        return
    existing = getattr(torch, "neuron", None)
    if existing is not None and existing is not module:
        raise RuntimeError("neuron_lab: another 'neuron' backend (torch-neuronx?) is registered; "
                           "use one or the other in a process")
    _setup_privateuseone_for_python_backend(rename="neuron", backend_module=module,
                                            hook=_Hooks(), device_guard=_Guard())
    _register_kernels()
    autocast.register()
    _patch_accelerator()
    _patch_tensor()
    _patch_serialization()
    _registered = True
