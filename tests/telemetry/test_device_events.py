"""Device events in torch.profiler (issue 44): with ProfilerActivity.PrivateUse1 each launch on
neuron is a device event (eager: each op; adaptive: each region launch) with its executor time,
modelled time, bytes and FLOPs, linked to the CPU op that launched it and to its line."""
import json
import os

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

import neuron_lab
from neuron_lab.device import profiler as device_profiler
from neuron_lab.runtime import knobs
from neuron_lab.telemetry.device_events import device_launches

pytestmark = pytest.mark.skipif(not device_profiler.registered(),
                                reason="the device extension was built without csrc/profiler.cpp")

ACTS = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _step(x, w):
    y = (x @ w).relu() * 2 + 1   # STEP-LINE
    return y.sum().item()


def _step_line() -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if "# STEP-LINE" in line)


def _device(prof):
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def test_registered_with_pytorch_registry():
    assert ProfilerActivity.PrivateUse1 in torch.autograd._supported_activities()


def test_eager_each_op_is_a_device_event_linked_to_its_cpu_op_and_line():
    x, w = torch.randn(32, 32, device="neuron"), torch.randn(32, 32, device="neuron")
    with neuron_lab.mode("eager"):
        _step(x, w)
        with profile(activities=ACTS) as prof:
            _step(x, w)
    names = [e.name for e in _device(prof)]
    assert names[:4] == ["aten::mm", "aten::relu", "aten::mul", "aten::add"]
    launches = device_launches()
    mm = launches[0]
    assert mm.kind == "op" and mm.bytes == 3 * 32 * 32 * 4 and mm.flops == 2 * 32 ** 3
    assert mm.modelled_s > 0 and mm.executor_s > 0
    assert mm.location.endswith(f"test_device_events.py:{_step_line()}")
    # the CPU op aten::mm carries the device time (key_averages' device columns)
    cpu_mm = [e for e in prof.events() if e.name == "aten::mm" and e.device_type == DeviceType.CPU]
    assert cpu_mm and cpu_mm[0].device_time_total > 0
    assert "Self NEURON" in prof.key_averages().table(row_limit=5)


def test_adaptive_region_launch_is_one_device_event(tmp_path):
    x, w = torch.randn(32, 32, device="neuron"), torch.randn(32, 32, device="neuron")
    with neuron_lab.mode("adaptive"), knobs.COMPILE.scoped(False):
        for _ in range(3):
            _step(x, w)
        with profile(activities=ACTS) as prof:
            for _ in range(2):
                _step(x, w)
    dev = _device(prof)
    assert len(dev) == 2 and all(e.name.startswith("region ") for e in dev)
    assert "(5 ops)" in dev[0].name and "mm" in dev[0].name
    launch = device_launches()[0]
    assert launch.ops == 5 and launch.region >= 0 and launch.modelled_s > 0
    assert launch.op_names[:2] == ["aten::mm", "aten::relu"]
    # linked to the runtime's launch range (its CPU op)
    ranges = [e for e in prof.events() if e.name.startswith("neuron::")
              and e.device_type == DeviceType.CPU]
    assert ranges and ranges[0].device_time_total > 0
    # the chrome trace: a device track with flows to the launching op
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    ev = trace["traceEvents"]
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    assert len(kernels) == 2 and kernels[0]["pid"] == 0
    args = kernels[0]["args"]
    assert args["External id"] > 0 and args["modelled_us"] > 0 and args["ops"] == 5
    # a region's line is where its last op (the sum) was issued
    assert args["source"].endswith(f"test_device_events.py:{_step_line() + 1}")
    assert any(e.get("ph") == "M" and e.get("args", {}).get("name") == "neuron:0" for e in ev)
    flows = [e for e in ev if e.get("cat") == "ac2g"]
    assert {e["ph"] for e in flows} == {"s", "f"}
    assert trace["deviceProperties"][0]["name"].startswith(("Trainium2", "Trainium3"))


def test_tensorboard_trace_handler_writes_the_device_track(tmp_path):
    x, w = torch.randn(16, 16, device="neuron"), torch.randn(16, 16, device="neuron")
    with neuron_lab.mode("eager"):
        with profile(activities=ACTS, on_trace_ready=tensorboard_trace_handler(str(tmp_path))):
            _step(x, w)
    files = [f for f in os.listdir(tmp_path) if f.endswith(".pt.trace.json")]
    assert len(files) == 1
    with open(tmp_path / files[0]) as f:
        trace = json.load(f)
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels and all({"device", "stream", "correlation", "External id"} <= set(e["args"])
                           for e in kernels)


def test_eager_views_are_no_launch_but_in_place_ops_are():
    x = torch.randn(8, 8, device="neuron")
    with neuron_lab.mode("eager"):
        with profile(activities=ACTS) as prof:
            x.t()
            x.view(64)
            x.t().contiguous()
            x.add_(1)
    assert [e.name for e in _device(prof)] == ["aten::clone", "aten::add_"]
