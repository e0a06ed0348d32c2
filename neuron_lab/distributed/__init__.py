"""Distributed training on ``neuron`` through PyTorch's own APIs (layer: imports device, runtime).

``import neuron_lab`` registers the ``neuron`` collective backend with ``torch.distributed``
(``backend.py``) and the ``neuron`` kernels of PyTorch's c10d collective ops
(``collectives.py``). Nothing here is a distributed engine of its own: ``init_process_group``,
``torchrun``, DDP, FSDP2, DTensor/DeviceMesh, tensor parallel and distributed checkpoint are
PyTorch's; this package makes the ``neuron`` device one they can run on.

``rank_info()`` is the process's place in the default group (for reports and the panel).
"""
from __future__ import annotations

from typing import NamedTuple

import torch.distributed as dist

from . import backend, collectives, functional


class RankInfo(NamedTuple):
    rank: int
    world_size: int
    backend: str | None


def rank_info() -> RankInfo:
    """(rank, world_size, backend) of the default process group; (0, 1, None) without one."""
    if dist.is_available() and dist.is_initialized():
        return RankInfo(dist.get_rank(), dist.get_world_size(), str(dist.get_backend()))
    return RankInfo(0, 1, None)


def register() -> None:
    """Register the backend and the collective kernels (idempotent)."""
    collectives.register()
    functional.register()
    backend.register()


__all__ = ["register", "rank_info", "RankInfo"]
