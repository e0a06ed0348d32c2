"""``torch.neuron``: the device module PyTorch looks up for the ``neuron`` backend.

Same names as ``torch.cuda`` where they apply (device management, RNG, memory, AMP), so code
written for ``torch.cuda`` or ``torch.accelerator`` ports by name. RNG: random ops run on the
host executor's default generator, so ``torch.manual_seed(s)`` gives the same ``randn`` on
``neuron`` as on the host, run after run.
"""
from __future__ import annotations

import torch

from . import executor, memory, properties, runtime_interface, streams

def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


_check_index = properties.check_index


def set_device(device) -> None:
    _check_index(device)


get_device_name = properties.device_name
get_device_properties = properties.device_properties
get_device_capability = properties.device_capability


def synchronize(device=None) -> None:
    """Wait for all queued device work (flushes the adaptive queue)."""
    runtime_interface.flush("synchronize")
    executor.synchronize()


def _gen() -> torch.Generator:
    dev = executor.host_device()
    return torch.cuda.default_generators[0] if dev.type == "cuda" else torch.default_generator


def manual_seed(seed: int) -> None:
    if executor.host_device().type == "cuda":
        torch.cuda.manual_seed(seed)
    # CPU executor: torch.manual_seed already seeded the host generator the device uses.


def manual_seed_all(seed: int) -> None:
    manual_seed(seed)


def seed() -> None:
    _gen().seed()


def initial_seed() -> int:
    return _gen().initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    return _gen().get_state()


def set_rng_state(state: torch.Tensor, device=None) -> None:
    _gen().set_state(state)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


Stream = streams.Stream
Event = streams.Event
StreamContext = streams.StreamContext
stream = streams.stream
current_stream = streams.current_stream
default_stream = streams.default_stream
set_stream = streams.set_stream


memory_allocated = memory.memory_allocated
max_memory_allocated = memory.max_memory_allocated
memory_reserved = memory.memory_reserved
max_memory_reserved = memory.max_memory_reserved
memory_stats = memory.memory_stats
memory_summary = memory.memory_summary
reset_peak_memory_stats = memory.reset_peak_memory_stats
reset_accumulated_memory_stats = memory.reset_accumulated_memory_stats
empty_cache = memory.empty_cache
mem_get_info = memory.mem_get_info


class device:
    """``with torch.neuron.device(i):`` — selects the (only) neuron device; PyTorch's storage
    and serialization code enters it when moving data to ``neuron``."""

    def __init__(self, device) -> None:
        self.idx = _check_index(device)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False
