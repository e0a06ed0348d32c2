"""What ``torch.neuron.get_device_properties`` reports: the modelled Trainium2 chip.

Same attribute names as ``torch.cuda.get_device_properties`` where they apply (``name``,
``major``/``minor``, ``total_memory``, ``multi_processor_count``), so code that sizes batches from
``total_memory`` or prints the device runs unchanged. The figures are the *model's*: one
Trainium2 chip has 8 NeuronCore-v3 (compute capability 3.0 here: the NeuronCore generation),
96 GiB HBM at 2.9 TB/s; ``total_memory`` is the modelled capacity (``NEURON_LAB_HBM_GB``, else the
default in ``memory.capacity``), read at call time so it always equals ``mem_get_info()[1]``.
``executor`` says where the emulated device really keeps its data.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import dtypes, executor, memory

CHIP = "Trainium2"
NEURON_CORES = 8              # NeuronCore-v3 per Trainium2 chip
CAPABILITY = (3, 0)           # NeuronCore generation (v3), as CUDA's (major, minor)
HBM_BYTES_PER_S = 2.9e12


class NeuronDeviceProperties(NamedTuple):
    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    memory_bandwidth: float   # bytes/s, the modelled HBM bandwidth
    executor: str
    is_emulated: bool

    def __repr__(self) -> str:
        return (f"NeuronDeviceProperties(name='{self.name}', major={self.major}, "
                f"minor={self.minor}, total_memory={self.total_memory >> 20}MB, "
                f"multi_processor_count={self.multi_processor_count}, "
                f"executor='{self.executor}', is_emulated={self.is_emulated})")


def check_index(device) -> int:
    """The device index ``device`` names (0, the only one), or a RuntimeError naming the fix."""
    if device is None:
        return 0
    if isinstance(device, int):
        idx = device
    else:
        dev = torch.device(device)
        if dev.type != "neuron":
            raise RuntimeError(f"neuron: expected a neuron device, got {dev}")
        idx = dev.index
    if idx not in (None, 0):
        raise RuntimeError(f"neuron: invalid device index {idx}: this machine has 1 neuron device "
                           f"(neuron:0)")
    return 0


def device_name(device=None) -> str:
    check_index(device)
    return f"{CHIP} (emulated on {executor.executor_name()})"


def device_properties(device=None) -> NeuronDeviceProperties:
    check_index(device)
    return NeuronDeviceProperties(
        name=device_name(), major=CAPABILITY[0], minor=CAPABILITY[1],
        total_memory=memory.capacity(), multi_processor_count=NEURON_CORES,
        memory_bandwidth=HBM_BYTES_PER_S, executor=executor.executor_name(), is_emulated=True)


def device_capability(device=None) -> tuple[int, int]:
    check_index(device)
    return CAPABILITY


def accelerator_capability(device=None) -> dict:
    """``torch.accelerator.get_device_capability``'s form: the dtypes tensors can have on the
    device *and be computed in* there (float64/complex live on the device but every op on them
    falls back to the host, see ``dtypes``)."""
    check_index(device)
    return {"supported_dtypes": set(dtypes.SUPPORTED)}
