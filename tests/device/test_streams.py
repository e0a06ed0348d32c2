"""Streams and events on ``neuron`` (issue 13, item 2), through ``torch.neuron``, the generic
``torch.Stream``/``torch.Event`` and ``torch.accelerator``, in both runtime modes.

What a stream means here (docs/device-contract.md): one engine runs queued work in issue order
whatever its stream; an event is a marker whose ``record`` first runs everything queued before
it, so results never depend on the streams used and ``elapsed_time`` is the host time between
markers.
"""
import threading

import pytest
import torch

import neuron_lab
from neuron_lab.device import native, tensor_data
from neuron_lab.runtime import knobs


def test_the_module_api_has_cudas_shape():
    m = torch.neuron
    default = m.default_stream()
    assert m.current_stream() == default and default.stream_id == 0
    assert torch.accelerator.current_stream() == default
    s = m.Stream()
    assert isinstance(s, torch.Stream) and isinstance(s, m.Stream)
    assert s.device == torch.device("neuron", 0) and s != default
    assert not isinstance(torch.Stream("cpu"), m.Stream)
    with m.stream(s) as entered:
        assert entered is s
        assert m.current_stream() == s == torch.accelerator.current_stream()
        with m.stream(None):                                    # no-op, as torch.cuda.stream
            assert m.current_stream() == s
    assert m.current_stream() == default
    m.set_stream(s)
    assert m.current_stream() == s
    m.set_stream(default)
    t = torch.Stream("neuron")
    with t:                                                     # the generic context manager
        assert torch.accelerator.current_stream() == t
    assert t.query() and s.query()
    t.synchronize()
    e = m.Event(enable_timing=True)
    assert isinstance(e, torch.Event) and isinstance(e, m.Event)
    assert not isinstance(torch.Event("cpu"), m.Event)
    assert e.query()                                            # never recorded: true, as CUDA


def test_current_stream_is_per_thread():
    s = torch.neuron.Stream()
    seen = []
    with torch.neuron.stream(s):
        th = threading.Thread(target=lambda: seen.append(torch.neuron.current_stream()))
        th.start()
        th.join()
        assert torch.neuron.current_stream() == s
    assert seen == [torch.neuron.default_stream()]


def test_bad_streams_and_events_are_clear():
    with pytest.raises(RuntimeError, match="1 neuron device"):
        torch.neuron.Stream(device="neuron:1")
    with pytest.raises(RuntimeError, match="needs a neuron stream"):
        torch.neuron.set_stream(torch.Stream("cpu"))
    with pytest.raises(RuntimeError, match="needs a neuron stream"):
        torch.ones(2, device="neuron").record_stream(torch.Stream("cpu"))
    a, b = torch.neuron.Event(), torch.neuron.Event()
    a.record()
    b.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing=True"):
        a.elapsed_time(b)
    c, d = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    c.record()
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        c.elapsed_time(d)


def _pipeline(host: torch.Tensor) -> dict:
    """The CUDA docs' pattern: copy and compute on a side stream, hand over to the main one."""
    main, side = torch.neuron.current_stream(), torch.neuron.Stream()
    side.wait_stream(main)
    with torch.neuron.stream(side):
        d = host.to("neuron", non_blocking=True)
        y = torch.relu(d * 2 - 1)
        done = side.record_event()
    main.wait_event(done)
    y.record_stream(main)
    z = (y @ y.T).sum(0)
    back = z.to("cpu", non_blocking=True)
    torch.neuron.current_stream().synchronize()
    return {"y": y.cpu(), "z": back}


def test_work_on_streams_is_ordered_and_equals_cpu(any_mode):
    host = torch.randn(64, 32)
    for _ in range(3):                  # adaptive: the regions are learned, then deferred
        out = _pipeline(host)
    ref_y = torch.relu(host * 2 - 1)
    assert torch.equal(out["y"], ref_y)
    assert torch.equal(out["z"], (ref_y @ ref_y.T).sum(0))


def test_backward_of_work_issued_on_a_side_stream(any_mode):
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(16, 8)
    ref = torch.nn.Linear(8, 4)
    ref.load_state_dict(lin.state_dict())
    lin.to("neuron")
    with torch.neuron.stream(torch.neuron.Stream()):
        loss = lin(x.to("neuron")).square().mean()
    loss.backward()
    ref(x).square().mean().backward()
    assert torch.equal(lin.weight.grad.cpu(), ref.weight.grad)


def test_recording_an_event_runs_the_queued_work():
    """Adaptive mode: deferred ops are complete once an event after them is recorded, and the
    event's query() is true; the guard asked the runtime to flush."""
    neuron_lab.runtime.reset()
    with knobs.COMPILE.scoped(False), neuron_lab.mode("adaptive"):
        x = torch.arange(8.0, device="neuron")
        for _ in range(3):
            (x * 2) + 1
            neuron_lab.sync()
        y = x * 2
        assert tensor_data.is_pending(y)
        flushes = native.load().guard_flushes()
        e = torch.Event("neuron")
        e.record()
        assert not tensor_data.is_pending(y) and e.query()
        assert native.load().guard_flushes() == flushes + 1
        assert torch.equal(y.cpu(), torch.arange(8.0) * 2)


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
def test_elapsed_time_spans_the_work_between_markers(mode):
    """elapsed_time is the host time of the work issued between the two records: recording the
    second marker runs that work, so the interval contains it (compared with a marker pair that
    encloses no work, not with a wall-clock bound)."""
    with neuron_lab.mode(mode), knobs.COMPILE.scoped(False):
        x = torch.randn(256, 256, device="neuron")
        start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
        empty = torch.neuron.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            x = torch.tanh(x @ x)
        end.record()
        end.synchronize()
        empty.record()
        work = start.elapsed_time(end)
        assert work > 0 and end.elapsed_time(empty) >= 0
        assert torch.isfinite(x).all()
