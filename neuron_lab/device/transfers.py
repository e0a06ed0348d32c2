"""Kernels of their own beside the generic one (``kernels.execute``): the transfer ops, which move
bytes between a neuron storage and another device's (``_copy_from``, ``_copy_from_and_resize``,
``set_`` onto a storage), and the packed-sequence ops, whose second output lives on the CPU.
``registry`` registers them for their ops (``SPECIAL``)."""
from __future__ import annotations

import torch

from . import kernels, runtime_interface, tensor_data, tracking
from .op_facts import facts

Tensor = torch.Tensor
_NEURON = "neuron"


def copy_from(src: Tensor, dst: Tensor, non_blocking: bool = False) -> Tensor:
    """``aten::_copy_from``: the cross-device half of ``copy_``."""
    if src.device.type == _NEURON and dst.device.type == _NEURON:
        tensor_data.host(dst).copy_(tensor_data.host(src))
    elif src.device.type == _NEURON:             # device -> host: a sync point
        runtime_interface.flush("cpu")
        tracking.record_sync("cpu")
        h = tensor_data.host(src)
        tracking.record_transfer("d2h", h.numel() * h.element_size())
        dst.copy_(h, non_blocking=False)
    else:                                        # host -> device
        h = tensor_data.host(dst)
        tracking.record_transfer("h2d", src.numel() * src.element_size())
        h.copy_(src, non_blocking=non_blocking and h.is_cuda)
    tracking.executed["aten::_copy_from"] += 1
    return dst


def copy_from_and_resize(src: Tensor, dst: Tensor) -> Tensor:
    if dst.device.type == _NEURON:
        h = tensor_data.host(dst)
        h.resize_(src.shape)
        kernels.regrow("aten::_copy_from_and_resize", h, dst)
        tensor_data.restride(dst, h)
    else:
        dst.resize_(src.shape)
    return copy_from(src, dst)


def set_storage(self: Tensor, source, storage_offset: int = 0, size=None, stride=None) -> Tensor:
    """``aten::set_`` onto a *storage*: onto the host storage the neuron storage is bound to.
    Reached by ``torch.load(..., map_location='neuron')`` (``_rebuild_tensor``)."""
    src = getattr(source, "_untyped_storage", source)
    hs = tensor_data.host_storage(src, None)
    if src.device.type != _NEURON or hs is None:
        raise RuntimeError(f"neuron: set_ needs a storage on neuron:0, got one on {src.device}")
    if size is None:
        size, stride = (hs.nbytes() // self.element_size(),), (1,)
    h = torch.empty(0, dtype=self.dtype, device=hs.device).set_(hs, storage_offset, size, stride)
    tensor_data.restride(self, h)
    tracking.executed["aten::set_"] += 1
    return self


def _cpu_second(op):
    """Packed-sequence ops whose second output (batch sizes / lengths) lives on the CPU on every
    device, as PyTorch's ``PackedSequence`` requires ("batch_sizes should always be on CPU")."""
    f = facts(op)

    def kernel(*args, **kwargs):
        first, second = kernels.execute(f, args, kwargs)
        return first, second.cpu()
    kernel.__name__ = f"neuron_{f.base}"
    return kernel


pack_padded_sequence = _cpu_second(torch.ops.aten._pack_padded_sequence.default)
pad_packed_sequence = _cpu_second(torch.ops.aten._pad_packed_sequence.default)
