"""The runtime's C extension (``runtime/csrc``, compiled by the package build into
``neuron_lab.runtime._runtime_ext``): the deferral hot path (``deferral.cpp``, with
``deferral_keys.cpp`` and ``pending_tensors.cpp``; used by ``fastpath``), the engine's
record keeping (``record.cpp``: ``record.record_run``, ``pending.live_outputs``,
``compiler.scalar_values``), per-op replay (``replay.cpp``: ``replay.replay_py``) and the fused
launch's call (``held_call.cpp``: ``fused.held_call_py``).

Every C function and type here has a Python reference with the same behaviour, next to the code
that uses it (``record.record_run_py``, ``replay.replay_py``, ``segment._Fields``...). The one
switch is ``NEURON_LAB_NATIVE_DEFER=0``: every module then runs its reference, which is how the
tests use them as the oracle (they compare the two; ``references()`` lists every pair). A leaf
module: the modules that pick an implementation import it, it imports none of them.
"""
from __future__ import annotations

from ..device import native as device_native
from . import knobs

MODULE = "neuron_lab.runtime._runtime_ext"


def extension():
    """The compiled extension, or None when ``NEURON_LAB_NATIVE_DEFER=0`` asks for the Python
    references (``device.native.NativeLibraryError`` if it cannot be loaded)."""
    if not knobs.NATIVE_DEFER.get():
        return None
    return device_native.extension(MODULE)


_references: dict = {}


def implementation(name: str, reference):
    """The extension's ``name``, or ``reference`` (its Python reference) with the extension
    switched off."""
    _references[name] = reference
    ext = extension()
    return reference if ext is None else getattr(ext, name)


def references() -> dict:
    """{name: Python reference} of every C implementation picked so far (the modules pick theirs
    at import)."""
    return dict(_references)
