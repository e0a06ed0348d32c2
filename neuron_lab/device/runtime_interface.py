"""The one interface between the device (layer 1) and an execution runtime (layer 2).

Without a runtime the device runs every op at once (``kernels.execute``). A runtime that
defers ops (``neuron_lab.runtime``'s adaptive engine) installs itself here, once, with
``install(runtime)``; the device calls it at these points and nowhere else:

- ``launch(facts, args, kwargs)``: every op called on ``neuron`` tensors (the generic kernel in
  ``registry``) goes to the runtime, which runs it, or queues it and returns pending outputs;
- ``flush(reason)``: before the host reads device data or waits for the device (``.cpu()``,
  ``torch.neuron.synchronize()``, stream/event sync), queued work runs;
- ``materialize(tensor)``: a pending output's host value is needed now (``tensor_data.host``);
- ``pending_bytes()``: the bytes of the pending outputs still alive (``memory``: they count in
  ``memory_allocated()`` though nothing is allocated for them yet);
- ``boundary(reason)``: a phase of a training step ends (a backward pass of ``neuron`` roots
  starts): the runtime may end what it has queued here, without waiting for it, so the device
  computes the forward pass while the host issues the backward's ops (optional).

A runtime that launches work on a thread of its own (the adaptive runtime's launch queue) also
gives ``wait_launches()``: wait until that work has run. ``tensor_data.host`` calls it before
handing out a host tensor, since a queued launch may still write it in place (an optimizer's
update).

They are module attributes so the hot path reads one global; ``install`` is the only
place that sets them (the layer rule: the device never imports the runtime).

One switch goes the other way: ``run_directly(on)``. While it is on, the device runs the ops
``OpFacts.direct`` names (plain ops, views, pointwise in-place ops) at once in C++, without
calling ``launch`` or entering Python (``csrc/direct.cpp``). It is on without a runtime; a
runtime turns it on when it would only run each op at once anyway (eager mode, nothing queued)
and off before it queues again.
"""
from __future__ import annotations

from typing import Any, Protocol


class Runtime(Protocol):
    def launch(self, facts, args: tuple, kwargs: dict) -> Any: ...
    def flush(self, reason: str) -> None: ...
    def materialize(self, tensor) -> Any: ...
    def pending_bytes(self) -> int: ...
    # optional: def wait_launches(self) -> None: wait for work launched on a thread of the runtime's
    # optional: def boundary(self, reason: str) -> None: a step's phase ends; do not wait


def _no_flush(reason: str) -> None:
    return None


def _no_materialize(tensor):
    raise RuntimeError("neuron: a pending tensor without an installed runtime "
                       "(neuron_lab.runtime installs one at import)")


def _no_pending() -> int:
    return 0


def _no_launches() -> None:
    return None


launch = None                  # None: every op runs at once (kernels.execute)
flush = _no_flush
materialize = _no_materialize
pending_bytes = _no_pending
wait_launches = _no_launches
boundary = _no_flush
direct = True                  # may direct ops run at once without calling launch?
_switch = None                 # the native kernels' switch (registry connects it)


def install(runtime: Runtime | None) -> None:
    """Route the device's calls to ``runtime`` (None: back to running ops at once).
    Installing a runtime turns ``direct`` off until the runtime turns it on."""
    global launch, flush, materialize, pending_bytes, wait_launches, boundary
    if runtime is None:
        launch, flush, materialize, pending_bytes = None, _no_flush, _no_materialize, _no_pending
        wait_launches, boundary = _no_launches, _no_flush
    else:
        launch, flush, materialize = runtime.launch, runtime.flush, runtime.materialize
        pending_bytes = runtime.pending_bytes
        wait_launches = getattr(runtime, "wait_launches", _no_launches)
        boundary = getattr(runtime, "boundary", _no_flush)
    run_directly(runtime is None)


def run_directly(on: bool) -> None:
    """Let the device run direct ops at once, without calling ``launch`` (on), or send every op
    to ``launch`` (off; the default while a runtime is installed)."""
    global direct
    direct = bool(on)
    if _switch is not None:
        _switch(direct)


def connect(switch) -> None:
    """``switch(on)`` follows ``direct`` from now on (the native direct kernel's)."""
    global _switch
    _switch = switch
    switch(direct)
