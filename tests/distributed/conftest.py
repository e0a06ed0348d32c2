"""Two-process jobs on loopback for the distributed tests.

``run_ranks(module, name, *args, world=2)`` runs ``module.name(rank, world, *args)`` in ``world`` fresh processes started by
PyTorch's own launcher (``torch.distributed.launcher.elastic_launch``, what ``torchrun`` runs),
each with a default group on the ``neuron`` backend, and returns ``{rank: fn's return value}``.
One job runs many checks: each start costs a few seconds (a fresh interpreter importing torch
and neuron_lab), so the tests share module-scoped jobs.
"""
from __future__ import annotations

import pytest

from launch_ranks import run_ranks


@pytest.fixture(scope="module")
def ranks():
    return run_ranks
