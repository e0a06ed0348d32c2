"""The host executor: where the emulated device keeps its data and runs its kernels.

CPU by default. ``NEURON_LAB_EXECUTOR=cuda`` (read once, at registration) puts the data on the
first CUDA device when one is present; every device rule (dtypes, capacity, fallbacks) stays the
same, only where the bytes live changes. A real-Neuron executor would replace this module.
"""
from __future__ import annotations

import torch

from . import config

_device: torch.device | None = None


def host_device() -> torch.device:
    global _device
    if _device is None:
        want = config.EXECUTOR.get()
        if want == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                "NEURON_LAB_EXECUTOR=cuda but torch.cuda.is_available() is False; "
                "unset NEURON_LAB_EXECUTOR to use the CPU executor")
        _device = torch.device("cuda", 0) if want == "cuda" else torch.device("cpu")
    return _device


def executor_name() -> str:
    return host_device().type


def synchronize() -> None:
    if host_device().type == "cuda":
        torch.cuda.synchronize()
