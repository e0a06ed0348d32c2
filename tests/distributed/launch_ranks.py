"""Start a 2-process job on loopback for the distributed tests (``run_ranks``).

A module of its own, not ``conftest.py``: the spawned ranks unpickle ``_entry`` by its module
name, and several ``conftest`` modules exist in the suite.
"""
from __future__ import annotations

import datetime
import importlib
import os
import signal
import sys
import uuid

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
    """The ranks' return values. The launcher installs its own SIGINT/SIGTERM/SIGHUP/SIGQUIT
    handlers in this process (torchrun's: it ends its ranks on a signal) and leaves them; they
    are put back after, so later tests see Python's own (tests/runtime/test_interrupts.py)."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    cfg = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world, run_id=uuid.uuid4().hex,
                       rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                       monitor_interval=0.2, start_method="spawn")
    kept = {s: signal.getsignal(s) for s in _LAUNCHER_SIGNALS}
    try:
        return elastic_launch(cfg, _entry)(module, name, backend, timeout_s, args)
    finally:
        for s, handler in kept.items():
            signal.signal(s, handler)


_LAUNCHER_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
