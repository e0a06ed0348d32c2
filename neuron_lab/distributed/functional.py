"""The ``neuron`` kernels of PyTorch's functional collectives (``_c10d_functional::*``).

DTensor, tensor parallel and ``torch.distributed._functional_collectives`` issue collectives as
functional ops: ``all_reduce(t)`` returns a new tensor and registers the in-flight ``Work`` in
c10d's registry under that tensor's *storage*; ``wait_tensor(t)`` (run by
``AsyncCollectiveTensor`` on first use) finds it there and waits. PyTorch's kernels for these
ops are CompositeExplicitAutograd; these PrivateUse1 kernels run them unchanged, and in adaptive
mode also wait before returning. Why: an ``AsyncCollectiveTensor`` defers its wait past view ops
(``view``, ``t``, slicing), and a deferred view is a pending tensor with a storage of its own
until its region runs, so ``wait_tensor`` on it would find no work — the next op would read the
buffer before gloo wrote it, and the registry would keep every unwaited work (and its tensors)
alive. In eager mode a view shares its base's storage (``tensor_data.view_of``), the lookup
succeeds, and collectives stay asynchronous. A collective is a region boundary in adaptive mode in
any case (``collectives.py``), so waiting there loses no fusion.
"""
from __future__ import annotations

import warnings

import torch

from .. import runtime
from .collectives import tensors_in

OPS = ("all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_",
       "all_gather_into_tensor", "all_gather_into_tensor_coalesced", "all_gather_into_tensor_out",
       "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_out",
       "all_to_all_single", "broadcast", "broadcast_")
_COMPOSITE = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
_libs: list = []


def _kernel(op):
    wait = torch.ops._c10d_functional.wait_tensor.default

    def kernel(*args, **kwargs):
        out = op.redispatch(_COMPOSITE, *args, **kwargs)
        if runtime.get_mode() == "adaptive":
            for t in tensors_in(out):
                wait(t)
        return out

    kernel.__name__ = f"neuron_{op.__name__}"
    return kernel


def register() -> None:
    """Install the kernels for PrivateUse1 (idempotent)."""
    if _libs:
        return
    lib = torch.library.Library("_c10d_functional", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in OPS:
            packet = getattr(torch.ops._c10d_functional, name)
            for overload in packet.overloads():
                lib.impl(getattr(packet, overload), _kernel(getattr(packet, overload)), "PrivateUse1")
    _libs.append(lib)
