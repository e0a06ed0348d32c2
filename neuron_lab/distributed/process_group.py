"""The ``neuron`` collective backend, registered with ``torch.distributed``.

``Backend.register_backend("neuron", create, devices=["cpu", "neuron"], extended_api=True)``
makes ``neuron`` the default backend for the ``neuron`` device, so ``init_process_group()``
with no backend picks it when neuron is the accelerator (PyTorch looks the accelerator up in
``Backend.default_device_backend_map``), and ``init_process_group("neuron")`` builds a group
that serves ``neuron`` and CPU tensors with it. ``torchrun``, ``init_device_mesh("neuron", ...)``,
DDP, FSDP2 and DTensor then find it as they find NCCL on CUDA.

What the backend is: a ``ProcessGroupGloo`` over the group's store, for the bytes of the host
executor. The emulated device's data lives in host memory, so gloo is the transport a real
backend would use for it, and its rendezvous, timeouts and error reporting are PyTorch's own.
What makes it a ``neuron`` backend is the dispatch side (``collectives.py``): PyTorch's c10d ops
reach it with ``neuron`` tensors, and those kernels flush the adaptive queue, hand gloo the
tensors' host views and return ``neuron`` results with telemetry. The CPU side of the group is
plain gloo.
"""
from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

NAME = "neuron"
_registered = False


def create(opts, backend_options=None):
    """``register_backend``'s extended-API creator: ``opts`` is PyTorch's
    ``_DistributedBackendOptions`` (store, group_rank, group_size, timeout, group_id,
    global_ranks_in_group)."""
    from torch.distributed import ProcessGroupGloo
    timeout = opts.timeout if isinstance(opts.timeout, timedelta) else timedelta(minutes=30)
    gloo = ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, timeout=timeout)
    gloo.options.global_ranks_in_group = list(opts.global_ranks_in_group)
    gloo.options.group_name = opts.group_id
    return gloo


def register() -> None:
    """Register the backend (idempotent)."""
    global _registered
    if _registered:
        return
    if not dist.is_available() or not dist.is_gloo_available():
        return   # a torch build without distributed/gloo: nothing to register with
    dist.Backend.register_backend(NAME, create, extended_api=True, devices=["cpu", NAME])
    _registered = True
