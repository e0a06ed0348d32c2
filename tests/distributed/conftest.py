"""Two-process jobs on loopback for the distributed tests.

``run_ranks(module, name, *args, world=2)`` runs ``module.name(rank, world, *args)`` in ``world`` fresh processes started by
PyTorch's own launcher (``torch.distributed.launcher.elastic_launch``, what ``torchrun`` runs),
each with a default group on the ``neuron`` backend, and returns ``{rank: fn's return value}``.
One job runs many checks: each start costs a few seconds (a fresh interpreter importing torch
and neuron_lab), so the tests share module-scoped jobs.
"""
from __future__ import annotations

import datetime
import importlib
import os
import sys
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _entry(module: str, name: str, backend, timeout_s: float, args: tuple):
    sys.path.insert(0, HERE)
    import torch.distributed as dist
    import neuron_lab  # noqa: F401  registers the device and the backend
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        fn = getattr(importlib.import_module(module), name)
        return fn(dist.get_rank(), dist.get_world_size(), *args)
    finally:
        dist.destroy_process_group()


def run_ranks(module: str, name: str, *args, world: int = 2, backend=None, timeout_s: float = 30):
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    cfg = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world, run_id=uuid.uuid4().hex,
                       rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                       monitor_interval=0.2, start_method="spawn")
    return elastic_launch(cfg, _entry)(module, name, backend, timeout_s, args)


@pytest.fixture(scope="module")
def ranks():
    return run_ranks
