"""The runtime's C extension (``runtime/csrc``): the deferral hot path (``deferral.cpp``, with
``deferral_keys.cpp`` and ``deferral_shells.cpp``; used by ``fastpath``), the engine's
record keeping (``records.cpp``: ``record.record_run``, ``pending.live_outputs``,
``compiler.scalar_values``), per-op replay (``replay.cpp``: ``replay.replay_py``) and the fused
launch's call (``held_call.cpp``: ``fused.held_call_py``). Built
once per source hash with the device's builder, next to the device's own extension.

Every C function here has a Python reference of the same name and behaviour, which is what runs
with ``NEURON_LAB_NATIVE_DEFER=0`` or without a C++ compiler (warned once); the tests compare
the two. A leaf module: the modules that pick a twin import it, it imports none of them.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from ..device import native
from . import knobs

CSRC = Path(__file__).with_name("csrc")

_ext = None


def extension():
    """The built extension, or None (not wanted, or no compiler: warned once)."""
    global _ext
    if _ext is None:
        if not knobs.NATIVE_DEFER.get():
            return None
        try:
            _ext = native.build("neuron_lab_runtime", CSRC, includes=(native.CSRC,))
        except RuntimeError as e:
            warnings.warn(f"{e}; the adaptive engine keeps its records in Python (slower, same "
                          f"results)", RuntimeWarning, stacklevel=2)
            _ext = False
    return _ext or None


def twin(name: str, python):
    """The extension's ``name``, or ``python`` (its reference) without the extension."""
    ext = extension()
    return python if ext is None else getattr(ext, name)
