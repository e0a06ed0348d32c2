"""The modelled Trainium chip, chosen once per process: ``NEURON_LAB_CHIP=trn2|trn3`` or
``neuron_lab.set_chip("trn3")`` before the device is first used.

One ``Chip`` record per generation holds what the device reports about itself (name, NeuronCores,
HBM capacity and bandwidth); ``torch.neuron.get_device_properties``, the memory model's default
capacity, the cost model (``telemetry/cost_model.py`` reads ``hbm_bytes`` and
``hbm_bytes_per_s`` from here) and the panel header all read ``current()``, so they cannot
disagree. Published figures carry their source; the rest are marked as assumptions.

Why "once": the capacity bounds every allocation already counted and the cost model prices what
was recorded; switching chips after tensors exist would silently re-price history and could put
live tensors over a smaller capacity. So a *different* chip after first use is an error naming
the fix (set it before the first ``.to("neuron")``, or start a new process); setting the same
chip again is allowed.
"""
from __future__ import annotations

from typing import NamedTuple

from . import config

GiB = 1 << 30


class Chip(NamedTuple):
    key: str                  # "trn2" | "trn3": NEURON_LAB_CHIP's value
    name: str                 # what get_device_name says
    neuron_cores: int         # NeuronCores per chip (multi_processor_count)
    core_generation: int      # NeuronCore-vN: the (major, minor) capability is (N, 0)
    hbm_bytes: int
    hbm_bytes_per_s: float
    source: str               # where the figures come from
    assumed: tuple = ()       # which fields are ours, not published


CHIPS: dict[str, Chip] = {
    "trn2": Chip("trn2", "Trainium2", 8, 3, 96 * GiB, 2.9e12,
                 "AWS Neuron documentation, Trainium2 architecture: 8 NeuronCore-v3, 96 GiB HBM, "
                 "2.9 TB/s"),
    "trn3": Chip("trn3", "Trainium3", 8, 4, 144 * GiB, 4.9e12,
                 "AWS Trainium3 announcement and Neuron documentation: 144 GB HBM3e, 4.9 TB/s",
                 assumed=("neuron_cores", "core_generation")),
}

CHIP = config.CHIP
assert set(CHIP.choices) == set(CHIPS), "config.CHIP's choices are this table's keys"


class ChipError(ValueError):
    """An unknown chip name, or a different chip asked for after first use."""


def current() -> Chip:
    """The chip this process models (``set_chip``'s value, else ``NEURON_LAB_CHIP``, else trn2)."""
    return CHIPS[CHIP.get()]


def lookup(key: str | None) -> Chip:
    """The chip named ``key`` (None: the current one), or ChipError naming the allowed ones."""
    if key is None:
        return current()
    try:
        return CHIPS[key]
    except (KeyError, TypeError):
        raise ChipError(f"neuron: unknown chip {key!r}; allowed: {', '.join(CHIPS)} "
                        f"(NEURON_LAB_CHIP or neuron_lab.set_chip)") from None


def used() -> bool:
    """Whether the device was used: memory was allocated on it (now or before the last peak
    reset) or an op ran on it."""
    from . import memory, tracking      # imported late: memory reads the chip for its capacity
    return (memory.memory_allocated() > 0 or memory.max_memory_allocated() > 0
            or bool(tracking.executed_ops()))


def set_chip(key: str) -> Chip:
    """Choose the modelled chip before the device is first used (``"trn2"`` or ``"trn3"``)."""
    chip = lookup(key)
    if chip.key != CHIP.get() and used():
        raise ChipError(
            f"neuron: set_chip({key!r}): the chip is chosen once, before the device is first "
            f"used, and this process already runs as {CHIP.get()!r} (tensors exist on neuron:0). "
            f"Fix: call neuron_lab.set_chip({key!r}) right after `import neuron_lab`, or start "
            f"the process with NEURON_LAB_CHIP={key}.")
    CHIP.set(chip.key)
    return chip
