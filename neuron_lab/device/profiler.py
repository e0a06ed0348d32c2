"""The device's side of its events in ``torch.profiler`` (``csrc/profiler.cpp``).

The C++ half is a Kineto ``IActivityProfiler`` registered with PyTorch's PrivateUse1 profiler
registry: with ``ProfilerActivity.PrivateUse1`` requested, each launch on ``neuron`` becomes a
device event. It needs three things it cannot know itself, all handed over when a profiling
session starts, by whoever the façade names (``on_session_start``; told again when it stops): the telemetry layer sets the
chip's parameters for the model, whether eager ops are launches (the mode), and completes the
adaptive runtime's region launches with their costs. The device layer never imports telemetry:
``neuron_lab/__init__.py`` passes the module's *name*, imported only when a session starts.

``location()`` is the locator the C++ calls for an eager op's event (the user's line, formatted
as everywhere else: ``Cell In[N], line M`` or ``file.py:line``).
"""
from __future__ import annotations

import importlib

from . import native, tracking

_module: str | None = None


def ext():
    """The device extension, if it was built with the profiler (else None)."""
    try:
        e = native.load()
    except Exception:           # no build: nothing to profile on
        return None
    return e if hasattr(e, "profiler_record_launch") else None


def location() -> str:
    """The user's line of the op being recorded (the C++ calls this for eager ops)."""
    return tracking.format_location(tracking.user_frame_token(1))[0]


def _session(started: bool) -> None:
    if _module is not None:
        m = importlib.import_module(_module)
        m.session_started() if started else m.session_stopped()


def on_session_start(module: str) -> None:
    """At every profiling session's start and stop, call ``module.session_started()`` /
    ``module.session_stopped()`` (the module is imported at the first start)."""
    global _module
    e = ext()
    if e is None:
        return
    _module = module
    e.profiler_set_locator(location)
    e.profiler_set_on_session(_session)


def registered() -> bool:
    """Whether the device's profiler is in PyTorch's PrivateUse1 profiler registry."""
    e = ext()
    return bool(e is not None and e.profiler_registered())
