"""Registering ``neuron`` with PyTorch through the PrivateUse1 extension point.

``_setup_privateuseone_for_python_backend`` gives the device guard and hooks that ``.to``,
``nn.Module.to`` and ``backward()`` need. It stops short in a few places, patched here, each
narrowly (the patch only changes behaviour for ``neuron`` and otherwise calls PyTorch's own):

1. ``torch.accelerator.synchronize`` raises "Backend doesn't support synchronizing all streams",
   ``torch.accelerator.memory.*`` says the allocator is not a DeviceAllocator and
   ``get_device_capability`` says the backend has none: all are routed to ``torch.neuron`` when
   the current accelerator is ``neuron``.
2. ``torch.save``: a shell's storage holds no bytes, so ``Tensor._reduce_ex_internal`` takes the
   path PyTorch already uses for storage-less backends (copy to CPU, rebuild on load honouring
   ``map_location``).
3. ``tensor.data = other`` swaps the TensorImpl's storage in C++ without a kernel call; the
   setter also refreshes the host view cached on the Python object. PyTorch allows the swap
   (and ``Module._apply`` keeps each Parameter object, so tied weights stay tied through
   ``.to``/``.to_empty``) only when ``_has_compatible_shallow_copy_type`` holds: built in for
   CPU/CUDA/MPS/... dense tensors, an operator a PrivateUse1 backend implements for its own
   (``_shallow_copy_compatible``, as PyTorch's OpenReg does). ``data_ptr()`` of a tensor whose
   value is still queued (adaptive mode) waits for it: a sync point.
4. ``repr`` of a neuron tensor is one sync point, counted as such: the contents are formatted
   from the host value (as torch_xla formats a CPU copy); PyTorch's formatter run on the device
   tensor would issue ~100 ``item()``s, copies and a ``masked_select``, each a sync of its own.
5. ``torch.load(map_location='neuron')``: restoring a storage onto the device (see
   ``_patch_serialization``) and ``set_`` onto a neuron storage (``kernels.set_storage``); a
   callable ``map_location`` for a neuron checkpoint.
6. ``torch.UntypedStorage(n, device='neuron')`` needs a C++ allocator (``_patch_storage``).
7. ``scaled_dot_product_attention`` picks its kernel through a C++ DispatchStub a Python backend
   cannot fill; ``_sdpa`` makes CPU's choice so results stay bitwise CPU's.
"""
from __future__ import annotations

import torch

from . import autocast, hooks, kernels, module, properties, streams, tracking
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
    """Ops without a neuron kernel. For ATen, only ops the scan above skipped; any other
    namespace's op (a custom op with only a CPU kernel, torchvision's...) runs its host kernel
    and is recorded as a fallback, like any op Trainium lacks."""
    f = facts(op)
    if op.namespace != "aten":
        tracking.record_fallback(f.name, "no neuron kernel: ran its CPU kernel on the host")
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

SPECIAL = {"_copy_from": kernels.copy_from, "_copy_from_and_resize": kernels.copy_from_and_resize,
           "_pin_memory": hooks.pin_device_tensor, "is_pinned": hooks.is_pinned_device_tensor,
           "_pack_padded_sequence": kernels.pack_padded_sequence,
           "_pad_packed_sequence": kernels.pad_packed_sequence}


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
    lib.impl("record_stream", streams.record_stream, "PrivateUse1")   # a CUDA-only op
    fb = torch.library.Library("_", "IMPL")
    fb.fallback(_fallback, dispatch_key="PrivateUse1")
    _libs.extend([lib, fb])
    return n


def _hints(sizes) -> list:
    """Concrete sizes for symbolic ones (their example values while tracing)."""
    from torch.fx.experimental.symbolic_shapes import optimization_hint
    return [s if type(s) is int else optimization_hint(s, fallback=8) for s in sizes]


def _no_tracing():
    from torch.utils._python_dispatch import _disable_current_modes
    return _disable_current_modes()


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
          enable_gqa=False):
    """``scaled_dot_product_attention`` as on CPU. Its C++ decomposition asks a DispatchStub
    for the backend, which a Python backend cannot register, so on ``neuron`` it would always
    take the math path while CPU takes its flash kernel (results differ in the last bits).
    Here the choice is CPU's (``_fused_sdp_choice`` runs on the host data) and so is the kernel."""
    aten = torch.ops.aten

    def cpu_view(t):
        """A CPU stand-in with what CPU's choice looks at (sizes, strides, dtype,
        requires_grad) and no data: reading the data would be a sync in adaptive mode."""
        if t is None or t.device.type != "neuron":
            return t
        return torch.empty_strided(_hints(t.shape), _hints(t.stride()), dtype=t.dtype,
                                   requires_grad=t.requires_grad)

    # Under torch.compile's tracing (fake tensors, maybe symbolic sizes) the choice is made
    # once, outside the trace, as CPU's C++ decomposition makes it: traced, its int-valued
    # node would reach AOTAutograd's partitioner ("Expected _fused_sdp_choice to be a tensor").
    with _no_tracing():
        choice = aten._fused_sdp_choice(*map(cpu_view, (q, k, v, attn_mask)), dropout_p,
                                        is_causal, scale=scale, enable_gqa=enable_gqa)
    if choice != int(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        return aten._scaled_dot_product_attention_math(
            q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]
    if attn_mask is not None and attn_mask.dtype == torch.bool:   # convert_boolean_attn_mask
        attn_mask = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(
            attn_mask.logical_not(), float("-inf"))
    return aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


def _register_sdpa() -> None:
    lib = torch.library.Library("aten", "IMPL")
    for key in ("PrivateUse1", "AutogradPrivateUse1"):   # the inner ops carry autograd
        lib.impl("scaled_dot_product_attention", _sdpa, key)
    _libs.append(lib)


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
    # torch.accelerator name -> torch.neuron name
    for name, ours in (("memory_allocated", None), ("max_memory_allocated", None),
                       ("memory_reserved", None), ("max_memory_reserved", None),
                       ("memory_stats", None), ("reset_peak_memory_stats", None),
                       ("reset_accumulated_memory_stats", None), ("empty_cache", None),
                       ("mem_get_info", None), ("get_memory_info", "mem_get_info")):
        orig = getattr(mem, name, None)
        if orig is None:
            continue

        def routed(*a, _orig=orig, _name=ours or name, **k):
            if acc.current_accelerator().type == "neuron":
                return getattr(module, _name)(*a, **k)
            return _orig(*a, **k)

        routed.__name__ = name
        setattr(mem, name, routed)
        if getattr(acc, name, None) is orig:
            setattr(acc, name, routed)
    # a Python PrivateUse1 hook cannot answer the C++ capability query ("Backend doesn't
    # support getting device capabilities")
    orig_cap = acc.get_device_capability

    def get_device_capability(device=None, /):
        if acc.current_accelerator().type == "neuron":
            return properties.accelerator_capability(device)
        return orig_cap(device)

    acc.get_device_capability = get_device_capability


# Devices whose dense tensors may swap TensorImpl contents with a neuron tensor (``.data =``):
# the ones PyTorch's TensorImpl::has_compatible_shallow_copy_type treats as dense, and neuron.
_DENSE = frozenset({"cpu", "cuda", "mps", "hip", "xpu", "hpu", "mtia", "neuron"})


def _shallow_copy_compatible(self, other) -> bool:
    """``aten::_has_compatible_shallow_copy_type`` for neuron: dense strided tensors of neuron
    and the dense devices are compatible (CPU <-> CUDA already are), so ``param.data = x.to(d)``
    keeps the Parameter object. Meta is not (as for CUDA): ``to_empty`` from meta makes new
    Parameters there too."""
    return (self.layout == torch.strided and other.layout == torch.strided
            and self.device.type in _DENSE and other.device.type in _DENSE)


def _register_shallow_copy() -> None:
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_has_compatible_shallow_copy_type", _shallow_copy_compatible, "PrivateUse1")
    _libs.append(lib)


def _patch_data_ptr() -> None:
    """A queued (adaptive) value has no host buffer yet, so no address: ``data_ptr()`` on it
    runs the queue first, as reading a CUDA pointer after an async launch is valid only for the
    allocation the launch writes, which exists already; here it exists once the queue ran."""
    from . import shell
    T, U = torch.Tensor, torch.UntypedStorage
    t_ptr, u_ptr = torch._C.TensorBase.data_ptr, torch._C.StorageBase.data_ptr

    def data_ptr(self):
        if self.device.type == "neuron" and shell.is_pending(self):
            shell.host(self)
        return t_ptr(self)

    def storage_data_ptr(self):
        if getattr(self, "_h", 0) is None:
            module.synchronize()
        return u_ptr(self)

    data_ptr.__doc__, storage_data_ptr.__doc__ = t_ptr.__doc__, u_ptr.__doc__
    T.data_ptr, U.data_ptr = data_ptr, storage_data_ptr


def _patch_tensor() -> None:
    T = torch.Tensor
    orig_reduce = T._reduce_ex_internal

    def _reduce_ex_internal(self, proto):
        if self.device.type == "neuron":
            return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                    (self.detach().cpu(), self.dtype, str(self.device), self.requires_grad))
        return orig_reduce(self, proto)

    T._reduce_ex_internal = _reduce_ex_internal

    # The host view cached on a neuron tensor's Python object (``_d``) is derived from its
    # storage, never state: pickled, it came back as a *second* tensor (mapped onto neuron by
    # ``map_location``) that kernels then read instead of the storage; deep-copied, it kept the
    # original's bytes. Both drop it; it is re-derived from the storage on next use.
    def __getstate__(self):
        state = self.__dict__
        return {k: v for k, v in state.items() if k != "_d"} if "_d" in state else state

    orig_deepcopy = T.__deepcopy__

    def __deepcopy__(self, memo):
        new = orig_deepcopy(self, memo)
        if "_d" in new.__dict__ and new.device.type == "neuron":
            del new._d
        return new

    T.__getstate__, T.__deepcopy__ = __getstate__, __deepcopy__

    data = torch._C.TensorBase.data

    def _set_data(self, value):
        data.__set__(self, value)
        if "_d" in self.__dict__:
            del self._d        # re-derived from the (new) storage on next use

    T.data = property(data.__get__, _set_data, doc=data.__doc__)

    from torch._subclasses.fake_tensor import is_fake

    orig_repr = T.__repr__

    def __repr__(self, *, tensor_contents=None):
        if self.device.type == "neuron":
            tracking.record_sync("repr")
            # Fake tensors (torch.compile's tracing, logged by AOTAutograd at DEBUG) and functorch
            # wrappers have no device data: torch's own repr prints their metadata.
            if tensor_contents is None and self.numel() and self.layout == torch.strided \
                    and not torch._C._functorch.is_functorch_wrapped_tensor(self) \
                    and not is_fake(self):
                from . import shell
                plain = type(self) in (torch.Tensor, torch.nn.Parameter)
                indent = len("tensor(" if plain else type(self).__name__ + "(")
                with torch.no_grad():
                    tensor_contents = torch._tensor_str._tensor_str(shell.host(self), indent)
        return orig_repr(self, tensor_contents=tensor_contents)

    T.__repr__ = __repr__


def _patch_serialization() -> None:
    """``torch.load(map_location='neuron')`` restores CPU storages onto the device: PyTorch's own
    path copies bytes into a device storage in C++, which has no bytes here. This restore
    function gives it a neuron storage backed by a host copy instead."""
    from . import memory, shell
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
        # a fresh-output shell's 0-byte storage: torch.load reads its data_ptr(), which raises on
        # a null storage that claims bytes; set_ onto it finds the bytes through ``_h``
        return shell.wrap(torch.empty(0, dtype=torch.uint8, device=hs.device).set_(hs)) \
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


def _patch_storage() -> None:
    """``torch.UntypedStorage(n, device='neuron')`` (also reached by ``storage.to(device=...)``
    and ``TypedStorage(..., device=...)``) asks C++ for the PrivateUse1 allocator, which a
    Python backend does not have: it segfaulted. Build the storage from host bytes instead."""
    from . import memory, shell
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
        return shell.storage_for(hs)

    U.__new__ = __new__


def register() -> None:
    """Register ``neuron`` (idempotent). Raises if another backend owns PrivateUse1."""
    global _registered
    if _registered:
        return
    existing = getattr(torch, "neuron", None)
    if existing is not None and existing is not module:
        raise RuntimeError("neuron_lab: another 'neuron' backend (torch-neuronx?) is registered; "
                           "use one or the other in a process")
    # _setup_privateuseone_for_python_backend's steps, with C++ hooks where they can be built
    torch.utils.generate_methods_for_privateuse1_backend()
    torch._register_device_module("neuron", module)
    if hooks.install():       # pinned memory and generators need the C++ hooks
        from . import native, shell
        shell.use_native(native.load())     # storages get their host buffer's address
    else:
        torch._C._acc.register_python_privateuseone_hook(_Hooks())
    torch._C._acc.register_python_privateuseone_device_guard(_Guard())
    streams.install()       # the C++ guard: streams and events (after the Python one)
    _register_kernels()
    _register_sdpa()
    _register_shallow_copy()
    autocast.register()
    _patch_accelerator()
    _patch_tensor()
    _patch_data_ptr()
    _patch_serialization()
    _patch_storage()
    _registered = True
