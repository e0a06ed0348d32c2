"""What ``torch.neuron.get_device_properties`` reports: the modelled chip (``chips.current()``:
Trainium2 unless ``NEURON_LAB_CHIP``/``neuron_lab.set_chip`` chose Trainium3).

Same attribute names as ``torch.cuda.get_device_properties`` where they apply (``name``,
``major``/``minor``, ``total_memory``, ``multi_processor_count``), so code that sizes batches from
``total_memory`` or prints the device runs unchanged. The figures are the *model's*: a Trainium2
chip has 8 NeuronCore-v3 (compute capability 3.0 here: the NeuronCore generation), 96 GiB HBM at
2.9 TB/s; a Trainium3 chip 144 GiB at 4.9 TB/s (chips.py lists sources and assumptions).
``total_memory`` is the modelled capacity (``NEURON_LAB_HBM_GB``, else the default in
``memory.capacity``), read at call time so it always equals ``mem_get_info()[1]``.
``executor`` says where the emulated device really keeps its data.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import chips, dtypes, executor, memory


class NeuronDeviceProperties(NamedTuple):
    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    memory_bandwidth: float   # bytes/s, the modelled HBM bandwidth
    executor: str
    is_emulated: bool
    chip: str                 # "trn2" | "trn3" (NEURON_LAB_CHIP)
    hbm_bytes: int            # the chip's HBM (total_memory may be less: the host's RAM bounds it)

    def __repr__(self) -> str:
        return (f"NeuronDeviceProperties(name='{self.name}', major={self.major}, "
                f"minor={self.minor}, total_memory={self.total_memory >> 20}MB, "
                f"multi_processor_count={self.multi_processor_count}, "
                f"memory_bandwidth={self.memory_bandwidth / 1e12:.1f}TB/s, "
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
    return f"{chips.current().name} (emulated on {executor.executor_name()})"


def device_properties(device=None) -> NeuronDeviceProperties:
    check_index(device)
    chip = chips.current()
    return NeuronDeviceProperties(
        name=device_name(), major=chip.core_generation, minor=0,
        total_memory=memory.capacity(), multi_processor_count=chip.neuron_cores,
        memory_bandwidth=chip.hbm_bytes_per_s, executor=executor.executor_name(),
        is_emulated=True, chip=chip.key, hbm_bytes=chip.hbm_bytes)


def device_capability(device=None) -> tuple[int, int]:
    check_index(device)
    return (chips.current().core_generation, 0)


def accelerator_capability(device=None) -> dict:
    """``torch.accelerator.get_device_capability``'s form: the dtypes tensors can have on the
    device *and be computed in* there (float64/complex live on the device but every op on them
    falls back to the host, see ``dtypes``)."""
    check_index(device)
    return {"supported_dtypes": set(dtypes.SUPPORTED)}
