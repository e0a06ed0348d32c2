"""The runtime's C extension (``runtime/csrc``, compiled by the package build into
``neuron_lab.runtime._runtime_ext``): the deferral hot path (``deferral.cpp``, with
``deferral_keys.cpp`` and ``deferral_shells.cpp``; used by ``fastpath``), the engine's
record keeping (``records.cpp``: ``record.record_run``, ``pending.live_outputs``,
``compiler.scalar_values``), per-op replay (``replay.cpp``: ``replay.replay_py``) and the fused
launch's call (``held_call.cpp``: ``fused.held_call_py``).

Every C function here has a Python reference of the same name and behaviour, which is what runs
with ``NEURON_LAB_NATIVE_DEFER=0``; the tests compare the two. A leaf module: the modules that
pick a twin import it, it imports none of them.
"""
from __future__ import annotations

from ..device import native
from . import knobs

MODULE = "neuron_lab.runtime._runtime_ext"


def extension():
    """The compiled extension, or None when ``NEURON_LAB_NATIVE_DEFER=0`` asks for the Python
    references (``native.NativeLibraryError`` if it cannot be loaded)."""
    if not knobs.NATIVE_DEFER.get():
        return None
    return native.extension(MODULE)


def twin(name: str, python):
    """The extension's ``name``, or ``python`` (its reference) with the extension switched off."""
    ext = extension()
    return python if ext is None else getattr(ext, name)
