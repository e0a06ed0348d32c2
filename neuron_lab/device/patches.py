"""Where ``_setup_privateuseone_for_python_backend`` stops short: narrow patches of PyTorch's
Python API, each changing behaviour only for ``neuron`` and otherwise calling PyTorch's own.

1. ``torch.accelerator.synchronize`` raises "Backend doesn't support synchronizing all streams",
   ``torch.accelerator.memory.*`` says the allocator is not a DeviceAllocator and
   ``get_device_capability`` says the backend has none: all are routed to ``torch.neuron`` when
   the current accelerator is ``neuron`` (``accelerator``).
2. ``torch.save``: a device tensor's storage holds no bytes, so ``Tensor._reduce_ex_internal`` takes
   the path PyTorch already uses for storage-less backends (copy to CPU, rebuild on load honouring
   ``map_location``) (``tensor``).
3. ``tensor.data = other`` swaps the TensorImpl's storage in C++ without a kernel call; the
   setter also refreshes the host view cached on the Python object (``tensor``); pickling and
   ``deepcopy`` drop that cached view (it is derived from the storage, never state). PyTorch allows
   the swap (and ``Module._apply`` keeps each Parameter object, so tied weights stay tied
   through ``.to``/``.to_empty``) only when ``_has_compatible_shallow_copy_type`` holds: built
   in for CPU/CUDA/MPS/... dense tensors, an operator a PrivateUse1 backend implements for its
   own (``registry._shallow_copy_compatible``, as PyTorch's OpenReg does).
4. ``data_ptr()`` of a tensor whose value is still queued (adaptive mode) waits for it: a sync
   point (``data_ptr``).
5. ``repr`` of a neuron tensor is one sync point, counted as such: the contents are formatted
   from the host value (as torch_xla formats a CPU copy); PyTorch's formatter run on the device
   tensor would issue ~100 ``item()``s, copies and a ``masked_select``, each a sync of its own
   (``tensor``).
6. ``backward()`` / ``autograd.grad`` from a ``neuron`` tensor runs on the calling thread, as
   CPU's does, instead of autograd's device thread for the device (``backward``).

Loading and storages made on the device are ``serialization``'s.
"""
from __future__ import annotations

import torch

from . import module, properties, runtime_interface, tracking


def accelerator() -> None:
    """Route ``torch.accelerator``'s synchronize, memory and capability calls to ``torch.neuron``."""
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


def data_ptr() -> None:
    """A queued (adaptive) value has no host buffer yet, so no address: ``data_ptr()`` on it
    runs the queue first, as reading a CUDA pointer after an async launch is valid only for the
    allocation the launch writes, which exists already; here it exists once the queue ran."""
    from . import tensor_data
    T, U = torch.Tensor, torch.UntypedStorage
    t_ptr, u_ptr = torch._C.TensorBase.data_ptr, torch._C.StorageBase.data_ptr

    def data_ptr(self):
        if self.device.type == "neuron" and tensor_data.is_pending(self):
            tensor_data.host(self)
        return t_ptr(self)

    def storage_data_ptr(self):
        if self.device.type == "neuron" and tensor_data.storage_is_pending(self):
            module.synchronize()
        return u_ptr(self)

    data_ptr.__doc__, storage_data_ptr.__doc__ = t_ptr.__doc__, u_ptr.__doc__
    T.data_ptr, U.data_ptr = data_ptr, storage_data_ptr


def tensor() -> None:
    """``torch.save``/pickle/deepcopy of a neuron tensor, ``tensor.data = other``, ``repr``."""
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
                from . import tensor_data
                plain = type(self) in (torch.Tensor, torch.nn.Parameter)
                indent = len("tensor(" if plain else type(self).__name__ + "(")
                with torch.no_grad():
                    tensor_contents = torch._tensor_str._tensor_str(tensor_data.host(self), indent)
        return orig_repr(self, tensor_contents=tensor_contents)

    T.__repr__ = __repr__


def backward() -> None:
    """Run the backward pass of ``neuron`` roots on the thread that called ``backward()``.

    PyTorch's autograd engine runs a non-CPU device's part of a backward pass on a thread of its
    own per device (``Engine::ready_queue``), so CUDA devices work concurrently. The emulated
    device computes on the host, synchronously, so that thread overlaps nothing; it only costs
    two thread hand-offs and the GIL's, ~120 us per ``backward()`` on a 2-core machine
    (``(w * 2).sum().backward()`` in eager mode: 155.6 us on the device thread, 44.3 us through
    this patch, CPU 21.0 us), ~40 % of a small training step's backward. For roots on
    ``neuron``, each call runs with autograd's per-thread multithreading switch off (PyTorch's
    own ``set_multithreading_enabled(False)``): the graph runs on the caller's thread, as CPU
    graphs always do. Roots on other devices keep PyTorch's behaviour, and a neuron graph
    reached from a CPU root (``model(x).cpu().sum().backward()``) still takes the device
    thread; both are correct, only slower. Reentrant and nested backward passes work as on CPU.

    A backward pass of ``neuron`` roots also tells the runtime that the forward pass has ended
    (``runtime_interface.boundary("backward")``): the adaptive runtime may launch the forward's
    region on the device's thread while the host issues the backward's ops, as an accelerator's host
    does (``NEURON_LAB_BACKWARD_BOUNDARY``)."""
    from torch.autograd.variable import Variable
    engine = Variable._execution_engine
    if isinstance(engine, _CallerThreadEngine):
        return
    Variable._execution_engine = _CallerThreadEngine(engine)


def _traced(roots) -> bool:
    """Is this backward pass a trace (AOTAutograd's joint graph under torch.compile: fake roots
    under a dispatch mode)? Its ops compute nothing, so it ends no phase of a step; flushing
    there would run the user's queued ops under the tracer's mode."""
    from torch._subclasses.fake_tensor import is_fake
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    return _get_current_dispatch_mode() is not None or \
        any(isinstance(t, torch.Tensor) and is_fake(t) for t in roots)


_mt_enabled = torch._C._is_multithreading_enabled
_set_mt = torch._C._set_multithreading_enabled


class _CallerThreadEngine:
    """PyTorch's ``ImperativeEngine`` with ``run_backward`` routed as ``backward`` says, and the
    calling line recorded for ops of the pass that run on a device thread
    (``tracking.backward_started``); every other attribute (``queue_callback``,
    ``is_checkpoint_valid``) is the engine's own."""
    __slots__ = ("engine",)

    def __init__(self, engine) -> None:
        self.engine = engine

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def run_backward(self, t_outputs, *args, **kwargs):
        saved = tracking.backward_started()       # the line ops of the pass are blamed on
        try:
            neuron = any(isinstance(t, torch.Tensor) and t.device.type == "neuron"
                         for t in t_outputs)
            if neuron and not _traced(t_outputs):
                # the forward may run while the backward is issued
                runtime_interface.boundary("backward")
            if neuron and _mt_enabled():
                _set_mt(False)
                try:
                    return self.engine.run_backward(t_outputs, *args, **kwargs)
                finally:
                    _set_mt(True)
            return self.engine.run_backward(t_outputs, *args, **kwargs)
        finally:
            tracking.backward_ended(saved)
