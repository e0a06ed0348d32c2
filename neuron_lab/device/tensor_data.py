"""Device tensors and the host data behind them.

Design choice (see DESIGN.md, "Pick one deliberately"): a ``neuron`` tensor is a *plain*
``torch.Tensor`` created by ``torch._C._acc.create_empty_tensor`` on the PrivateUse1 key, not a
``__torch_dispatch__`` wrapper subclass. Measured on this machine (2 cores, torch 2.13, 1 K floats):
a wrapper subclass costs ~10-13 us/op (Python-key dispatch + ``_make_wrapper_subclass``), a
PrivateUse1 kernel registered with ``torch.library`` ~5 us/op, against ~2 us native. The plain
tensor also behaves exactly like a backend tensor: ``type(x) is torch.Tensor``, ``tolist()``,
``numpy()`` raising as on CUDA, autograd's own PrivateUse1 kernels.

Where the data lives: every device tensor's *storage* is bound, in C++, to the host
``UntypedStorage`` with the bytes (``csrc/storage.cpp``); the device tensor mirrors the host
tensor's size/stride/offset. ``t._d`` caches the host view for speed (one attribute read on the
hot path); ``t._d is None`` marks a pending tensor (an adaptive output whose region has not run).
PyTorch sometimes makes shallow copies in C++ that never pass through a kernel (``.data``,
autograd's saved outputs, ``Parameter``); those share the StorageImpl, so ``host()`` rebuilds
their view from the storage.

A storage's state is C++'s (bound, pending, or not the device's), read through ``host_storage``
and ``is_pending``, never an attribute of the storage's Python object: nothing here wraps a
device storage in a Python object on an op's path, because a storage that has had one keeps a
use count of two, and autograd then accumulates gradients in it out of place.

The conjugate and negative bits (``x.conj()``, ``_neg_view``) live on the TensorImpl, not in the
bytes: ``wrap`` copies them from the host tensor, ``_recover`` back onto a rebuilt host view.

Tensors made by the direct eager kernel (``csrc/direct.cpp``: plain ops in eager mode run
without entering Python) carry no attributes: their storage is bound in C++ like every other.

A device storage has the host storage's address and size (``bind``): its ``data_ptr()`` is the
host buffer's address, non-zero, unique per buffer and stable, the same for every view of the
buffer, as on any device, so libraries that tell shared from distinct storage by address
(safetensors, ``save_pretrained``) see what they would on CUDA. A pending storage has no address
until its value exists: ``data_ptr()`` on it is a sync point (``patches.data_ptr``).
"""
from __future__ import annotations

import torch

from . import runtime_interface

DEVICE = torch.device("neuron", 0)
_create = torch._C._acc.create_empty_tensor
_from_ptr = torch._C._construct_storage_from_data_pointer
_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset
_empty = torch.empty
_set_conj, _set_neg = torch._C._set_conj, torch._C._set_neg

_bind = None             # native bind_storage(device, host): tensors or storages
_host_storage = None     # native host_storage(device, missing)
_mark_pending = None     # native mark_pending(device)
_is_pending = None       # native is_pending(device)
_host_view = None        # native host_view(tensor): _recover's common case in C++
_view_on = None          # native view_on(base, h): view_of in C++
_NOT_OURS = object()


def use_native(ext) -> None:
    global _bind, _host_storage, _mark_pending, _is_pending, _host_view, _view_on
    _bind, _host_storage, _host_view = ext.bind_storage, ext.host_storage, ext.host_view
    _view_on = ext.view_on
    _mark_pending, _is_pending = ext.mark_pending, ext.is_pending


def bind(device, host) -> None:
    """Give the device storage of ``device`` (a tensor or storage) the bytes of ``host``'s (a
    tensor or storage): the host buffer's address and size, which the storage keeps alive."""
    _bind(device, host)


def host_storage(st, missing=0):
    """The host storage behind device storage (or tensor) ``st``: ``None`` for a pending output,
    ``missing`` for a storage the device did not make."""
    return _host_storage(st, missing)


def mark_pending(device) -> None:
    """Mark the storage of ``device`` (a tensor or storage) pending: no value yet."""
    _mark_pending(device)


def hold_storage(s: torch.Tensor) -> None:
    """Hold the storage of device tensor ``s`` once more for the storage's life, as an eager
    view's storage is held by its base too (``runtime.output_plans.out_plan`` says why): by its
    Python object, which a storage keeps, with a reference, once it has had one."""
    s.untyped_storage()


def storage_is_pending(device) -> bool:
    """Is the storage of ``device`` (a tensor or storage) a pending output's?"""
    return _is_pending(device)


def _restride_into(s: torch.Tensor, size, stride, offset: int, nbytes: int, host_storage) -> None:
    st = _from_ptr(0, DEVICE, nbytes)
    if host_storage is not None:
        _bind(st, host_storage)
    else:
        _mark_pending(st)
    # CPU's set_ kernel only rewrites TensorImpl metadata; it never touches the (null) data.
    _set_storage.redispatch(_CPU, s, st, offset, size, stride)


def wrap(h: torch.Tensor, hs=None) -> torch.Tensor:
    """A new device tensor for host tensor ``h`` (same size, stride, offset, dtype); ``hs``: its
    storage, if the caller has it."""
    s = _create(h.shape, h.dtype) if h.is_contiguous() and h.storage_offset() == 0 else None
    # the strides exactly, size-1 dimensions' too: a contiguous (2, 50, 1) host tensor may have
    # strides (50, 1, 50), and CPU's kernels choose their paths by them (a host view rebuilt
    # from the device tensor, as the native direct kernel builds it, must be the same tensor)
    if s is not None and s.stride() == h.stride():
        _bind(s, h if hs is None else hs)          # inline: wrap is on every op's path
    else:
        if hs is None:
            hs = h.untyped_storage()
        s = _create((0,), h.dtype)
        _restride_into(s, h.shape, h.stride(), h.storage_offset(), hs.nbytes(), hs)
    if h.is_conj():       # inline, not _copy_bits: wrap is on every op's path
        _set_conj(s, True)
    if h.is_neg():
        _set_neg(s, True)
    s._d = h
    return s


def _copy_bits(src: torch.Tensor, dst: torch.Tensor) -> None:
    """Conjugate/negative views are bits on the TensorImpl, not in the bytes: copy them over."""
    if src.is_conj():
        _set_conj(dst, True)
    if src.is_neg():
        _set_neg(dst, True)


def view_of(base: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """A device tensor for ``h``, a host view of device tensor ``base``'s bytes (``view``, slicing,
    ``t``, ``as_strided``...), on ``base``'s own storage: as on any device, a view shares its base's
    StorageImpl, so ``untyped_storage()``, ``torch._C._is_alias_of`` and everything keyed by
    storage (c10d's registry of in-flight collectives that ``wait_tensor`` looks up, DDP's
    bucket views) see one storage. Falls back to ``wrap`` when ``h`` is not on ``base``'s bytes."""
    s = _view_on(base, h)
    if s is None:
        return wrap(h)
    s._d = h
    return s


def storage_for(hs) -> torch.UntypedStorage:
    """A neuron storage backed by host storage ``hs`` and sized like it, for storages made
    directly (``torch.UntypedStorage(n, device='neuron')``: ``copy_`` and ``nbytes`` must work)."""
    s = _create((0,), torch.uint8)
    _restride_into(s, (hs.nbytes(),), (1,), 0, hs.nbytes(), hs)
    return s.untyped_storage()


def restride(s: torch.Tensor, h: torch.Tensor) -> None:
    """Make existing device tensor ``s`` mirror ``h`` after an in-place metadata change (resize_,
    t_, out=)."""
    hs = h.untyped_storage()
    _restride_into(s, h.shape, h.stride(), h.storage_offset(), hs.nbytes(), hs)
    s._d = h


def restride_meta(s: torch.Tensor, size, stride, offset: int) -> None:
    """Give device tensor ``s`` new size/stride/offset ahead of its data (a deferred
    ``t_``/``squeeze_``): the host tensor is changed the same way when the region runs."""
    if tuple(s.shape) == tuple(size) and s.stride() == tuple(stride) and s.storage_offset() == offset:
        return
    hs = _host_storage(s, None)
    span = 1 + sum((n - 1) * st for n, st in zip(size, stride) if n > 0) if all(size) else 0
    nbytes = max((offset + span) * s.element_size(), hs.nbytes() if hs is not None else 0)
    _restride_into(s, size, stride, offset, nbytes, hs)


def pending(size, stride, dtype: torch.dtype, offset: int = 0) -> torch.Tensor:
    """A device tensor whose value is not computed yet (adaptive runtime); ``host()`` asks the
    runtime."""
    s = _create(size, dtype)
    if offset or tuple(stride) != s.stride():
        span = 1 + sum((n - 1) * st for n, st in zip(size, stride) if n > 0) if s.numel() else 0
        _restride_into(s, size, stride, offset, (offset + span) * s.element_size(), None)
    else:
        _mark_pending(s)
    s._d = None
    return s


def pending_dense(size, dtype: torch.dtype) -> torch.Tensor:
    """``pending`` for a contiguous value at offset 0 (the common case, on the deferral hot
    path)."""
    s = _create(size, dtype)
    _mark_pending(s)
    s._d = None
    return s


def fill(s: torch.Tensor, h: torch.Tensor) -> None:
    """Give a pending tensor its value."""
    _bind(s, h)
    s._d = h


def is_pending(s: torch.Tensor) -> bool:
    try:
        return s._d is None
    except AttributeError:
        return _is_pending(s)


def host(s: torch.Tensor) -> torch.Tensor:
    """The host tensor holding ``s``'s value (materializing a pending value), once the launches
    the runtime queued on the device have run (``runtime_interface.wait_launches``: one may write it
    in place)."""
    runtime_interface.wait_launches()
    return host_now(s)


def host_now(s: torch.Tensor) -> torch.Tensor:
    """``host`` for a launch itself (the device's thread, or a launch the host runs after the
    queue): what the launches before it left."""
    try:
        d = s._d
    except AttributeError:
        d = _recover(s)
    if d is None:
        d = runtime_interface.materialize(s)      # a pending output: the runtime computes it
    return d


def _recover(s: torch.Tensor):
    """``host``'s view of a device tensor without a cached one (a tensor the direct kernel made, or
    one autograd made anew): built on its storage's host bytes and cached in ``s._d``."""
    if _host_view is not None:
        d = _host_view(s)
        if d is not None:
            s._d = d
            return d
    hs = _host_storage(s, _NOT_OURS)
    if hs is _NOT_OURS:
        raise RuntimeError(
            f"neuron: tensor of shape {tuple(s.shape)} on {s.device} has no device data "
            "(it was not created by neuron_lab); create neuron tensors with .to('neuron') or a "
            "factory with device='neuron'")
    if hs is None:
        return None
    from .executor import host_device
    d = _empty(0, dtype=s.dtype, device=host_device()).set_(hs, s.storage_offset(), s.size(), s.stride())
    _copy_bits(s, d)
    s._d = d
    return d
