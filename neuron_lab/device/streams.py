"""``torch.neuron.Stream``/``Event`` and the current-stream functions, as ``torch.cuda`` has them.

The semantics live in the C++ guard (``csrc/guard.cpp``), which PyTorch's generic
``torch.Stream("neuron")``, ``torch.Event("neuron")``, ``torch.accelerator.current_stream()`` and
the autograd engine reach directly; this module gives them the ``torch.cuda`` shape. What a
stream means on the emulated device (docs/device-contract.md):

- a stream is an ordered queue of work; the device has one engine that runs queued work in
  issue order, whatever its stream — a valid schedule of PyTorch's stream semantics (order is
  promised within a stream and across recorded events only), so ``wait_event``/``wait_stream``
  never need to hold anything back and results never depend on the stream used;
- an event is a marker: ``record`` runs the work queued before it (in adaptive mode, a flush:
  a region boundary) and stamps the host clock, so ``query()`` is true once recorded, and
  ``elapsed_time`` is the host time between two markers, i.e. the time the device took for the
  work issued between them (a flush is also a boundary for the adaptive runtime);
- ``Stream.synchronize``/``query`` and ``torch.neuron.synchronize`` run everything queued.
"""
from __future__ import annotations

import torch

from . import executor, properties

def flush(reason: str) -> None:
    """Run all queued device work (the guard calls this from event record, stream query and
    synchronize): the adaptive runtime's flush, then the host executor's own sync."""
    from . import runtime_interface
    runtime_interface.flush(reason)
    executor.synchronize()


def _native_guard():
    from . import native
    return native.load()


class _OnNeuron(type):
    """``isinstance(x, torch.neuron.Stream)``: a ``torch.Stream``/``torch.Event`` on neuron."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, cls._generic) and obj.device.type == "neuron"


class Stream(metaclass=_OnNeuron):
    """A new stream on ``neuron:0``: PyTorch's generic ``torch.Stream`` (``query``,
    ``synchronize``, ``wait_event``, ``wait_stream``, ``record_event``, ``with s:``), as
    ``torch.accelerator`` code expects. Not a subclass: PyTorch's C++ bindings check for the exact
    type (``torch.Event.elapsed_time`` refuses a subclass instance). ``priority`` is accepted and
    has no effect: one engine runs all queued work in issue order."""

    _generic = torch.Stream

    def __new__(cls, device=None, priority: int = 0) -> torch.Stream:
        _native_guard()
        properties.check_index(device)
        return torch.Stream(device="neuron", priority=priority)


class Event(metaclass=_OnNeuron):
    """A marker in a stream on ``neuron:0`` (``torch.Event``: ``record``, ``wait``, ``query``,
    ``synchronize``, ``elapsed_time``); see the module docstring for what each means here."""

    _generic = torch.Event

    def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False) -> torch.Event:
        _native_guard()
        return torch.Event(device="neuron", enable_timing=enable_timing, blocking=blocking,
                           interprocess=interprocess)


def current_stream(device=None) -> torch.Stream:
    """The calling thread's current stream (per thread, as on CUDA)."""
    properties.check_index(device)
    _native_guard()
    return torch._C._accelerator_getStream(0)


def default_stream(device=None) -> torch.Stream:
    properties.check_index(device)
    _native_guard()
    cur = torch._C._accelerator_getStream(0)
    return torch.Stream(stream_id=0, device_index=0, device_type=cur.device_type)


def set_stream(stream: torch.Stream) -> None:
    """Make ``stream`` the calling thread's current stream."""
    if stream is None:
        return
    if stream.device.type != "neuron":
        raise RuntimeError(f"neuron: set_stream needs a neuron stream, got one on {stream.device}")
    _native_guard()
    torch._C._accelerator_setStream(stream)


class StreamContext:
    """``with torch.neuron.stream(s):`` — ``s`` is the current stream inside (None: no-op)."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self.prev: torch.Stream | None = None

    def __enter__(self):
        if self.stream is not None:
            self.prev = current_stream()
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc) -> bool:
        if self.stream is not None:
            set_stream(self.prev)
        return False


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)


def record_stream(tensor: torch.Tensor, stream: torch.Stream) -> None:
    """``Tensor.record_stream(s)``: tells a caching allocator not to reuse the tensor's memory
    before ``s``'s queued work ran. Nothing to do here: a storage is freed only when its last
    reference dies, and queued work holds references to everything it reads and writes."""
    if stream.device.type != "neuron":
        raise RuntimeError(f"neuron: record_stream on a neuron tensor needs a neuron stream, got "
                           f"one on {stream.device}")


def install() -> bool:
    """Put the native guard in place of the Python one (called at registration). False, and
    streams unavailable, when the extension cannot be built."""
    try:
        ext = _native_guard()
    except RuntimeError:
        return False
    ext.install_guard()
    ext.set_flush(flush)
    return True
