"""Distributed training on ``neuron`` through PyTorch's own APIs (layer: imports device, runtime).

``import neuron_lab`` registers the ``neuron`` collective backend with ``torch.distributed``
(``process_group.py``) and the ``neuron`` kernels of PyTorch's c10d collective ops
(``collectives.py``). Nothing here is a distributed engine of its own: ``init_process_group``,
``torchrun``, DDP, FSDP2, DTensor/DeviceMesh, tensor parallel and distributed checkpoint are
PyTorch's; this package makes the ``neuron`` device one they can run on.

``rank_info()`` is the process's place in the default group, ``summary()`` adds the collectives
it ran (``metrics()["distributed"]``, the report, ``%neuron`` and the panel).
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch.distributed as dist

from ..device import tracking
from . import collectives, functional, process_group


class RankInfo(NamedTuple):
    rank: int
    world_size: int
    backend: str | None


def rank_info() -> RankInfo:
    """(rank, world_size, backend) of the default process group. Without one (before
    ``init_process_group`` or after ``destroy_process_group``), the place a launcher gave the
    process (torchrun's ``RANK``/``WORLD_SIZE``), else (0, 1, None)."""
    if dist.is_available() and dist.is_initialized():
        return RankInfo(dist.get_rank(), dist.get_world_size(), str(dist.get_backend_config()))
    try:
        return RankInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None)
    except (KeyError, ValueError):
        return RankInfo(0, 1, None)


def summary() -> dict:
    """The process's place in its job and the collectives it ran on neuron tensors (for
    ``metrics()``, the report and the panel)."""
    info = rank_info()
    c = tracking.counters()
    return {"rank": info.rank, "world_size": info.world_size, "backend": info.backend,
            "collectives": c.get("collectives", 0), "collective_bytes": c.get("collective_bytes", 0),
            "collective_s": c.get("collective_s", 0.0), "ops": tracking.collective_ops()}


def register() -> None:
    """Register the backend and the collective kernels (idempotent)."""
    collectives.register()
    functional.register()
    process_group.register()


__all__ = ["register", "rank_info", "RankInfo", "summary"]
