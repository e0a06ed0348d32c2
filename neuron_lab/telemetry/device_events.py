"""Device events in ``torch.profiler``: the telemetry layer's half (device/csrc/profiler.cpp is
the other).

``torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])``
starts a session of the device's Kineto profiler, which calls ``session_started()`` here
(``neuron_lab/__init__.py`` wires it, so the device layer never imports telemetry). It hands the
C++ what only this layer knows:

- the modelled chip's parameters (``cost_model()``: HBM bandwidth, launch overhead, FP32 peak),
  with which the C++ prices each eager op (bytes in and out, FLOPs) as it records it;
- whether eager ops are launches: in eager mode every leaf op on a neuron tensor is one kernel;
  in adaptive mode ops are queued and the launches are the runtime's region launches;
- each region launch's name, ops, modelled cost and user line, from the runtime's ``launch``
  event, which follows the launch's ``neuron::fused[region N]`` range on the same thread: the
  C++ took that range's times and correlation id.

``device_launches()`` reads the recorded launches back as ``DeviceLaunch`` records (the last
session's, until the next starts): ``profile()`` exports them (``parquet.py``).
"""
from __future__ import annotations

import json
from typing import NamedTuple

from .. import runtime
from ..device import events, profiler, properties, tracking
from ..runtime import knobs
from .cost_model import cost_model
from .costing import region_cost

NAME_OPS = 4          # op names shown in a region launch's event name

_watching = False           # the mode knob is watched (once per process)
_unsubscribe = None         # listening to the runtime's launches: only while a session records


class DeviceLaunch(NamedTuple):
    """One launch on the device, as the profiler recorded it (times: Unix seconds)."""
    name: str             # the op, or "region N: op, op, ..." for a region
    kind: str             # "op" (eager) | "fused" | "per-op" (a region the host ran op by op)
    start: float
    executor_s: float     # measured on the host executor
    modelled_s: float     # the chip's launch, modelled (a recognised region: one fused launch)
    bytes: int
    flops: float
    region: int           # -1 for an eager op
    ops: int
    op_names: list
    location: str         # the user's line: the op's, or where the region's last op was issued
    correlation: int      # the launching CPU op's id in torch.profiler (0: none open)
    thread: int


def _ext():
    return profiler.ext()


def _follow_mode() -> None:
    e = _ext()
    if e is not None:
        e.profiler_set_eager(runtime.get_mode() == "eager")


def region_name(rid: int, names: list, ops: int) -> str:
    shown = ", ".join(n.removeprefix("aten::") for n in names[:NAME_OPS])
    return f"region {rid}: {shown}{', ...' if ops > NAME_OPS else ''} ({ops} ops)"


def _on_event(kind: str, p: dict) -> None:
    if kind != events.LAUNCH:
        return
    e = _ext()
    if e is None or not e.profiler_recording():
        return
    rid, n = p.get("region", -1), p.get("ops", 0)
    region = runtime.current().region(rid)
    names = list(region.names) if region is not None else []
    modelled = nbytes = flops = 0
    where = ""
    if region is not None:
        model = cost_model()
        c = region_cost(region).fused
        modelled, nbytes, flops = model.launch_s(c), c.bytes, c.flops
        where = tracking.format_location(region.where)[0]
    e.profiler_record_launch(region_name(rid, names, n), p.get("kind", "per-op"), rid, n,
                             p.get("seconds", 0.0), modelled, nbytes, flops, where,
                             json.dumps(names))


def _device_properties() -> dict:
    """The trace's ``deviceProperties`` entry, in the fields the TensorBoard profiler plugin and
    HTA read for a CUDA device (``id``, ``name``, ``totalGlobalMem``, ``computeMajor``/``Minor``,
    ``numSms``), plus the modelled chip's figures."""
    p = properties.device_properties(0)
    return {"id": 0, "name": p.name, "totalGlobalMem": p.total_memory,
            "computeMajor": p.major, "computeMinor": p.minor,
            "numSms": p.multi_processor_count, "chip": p.chip,
            "hbmBytesPerSecond": p.memory_bandwidth, "emulated": True}


def session_started() -> None:
    """A profiling session with device activities starts: hand the C++ the chip and the mode,
    and listen for the runtime's launches until it stops."""
    global _watching, _unsubscribe
    e = _ext()
    if e is None:
        return
    m = cost_model()
    e.profiler_set_chip(m.chip, m.params.hbm_bytes_per_s, m.params.launch_overhead_s,
                        m.peak("float32"), json.dumps(_device_properties()))
    _follow_mode()
    if not _watching:
        knobs.MODE.watch(_follow_mode)
        _watching = True
    if _unsubscribe is None:
        _unsubscribe = events.subscribe(_on_event)


def session_stopped() -> None:
    """The session stopped: stop listening (the bus is quiet again when nobody profiles)."""
    global _unsubscribe
    if _unsubscribe is not None:
        _unsubscribe()
        _unsubscribe = None


def device_launches() -> list[DeviceLaunch]:
    """The launches of the current (or the last finished) profiling session."""
    e = _ext()
    if e is None:
        return []
    out = []
    for d in e.profiler_launches():
        try:
            names = json.loads(d["op_names"]) if d["op_names"] else []
        except ValueError:
            names = []
        out.append(DeviceLaunch(
            d["name"], d["kind"], d["start_ns"] / 1e9, (d["end_ns"] - d["start_ns"]) / 1e9,
            d["modelled_s"], d["bytes"], d["flops"], d["region"], d["ops"], names,
            d["location"], d["correlation"], d["thread"]))
    return out
