"""Memory accounting of deferred outputs: a live pending output counts in memory_allocated()
(as CUDA counts a kernel's output at issue), its host storage is counted when the region runs,
and an intermediate that dies inside a region is never allocated (issue 10, item 5)."""
import gc

import pytest
import torch

import neuron_lab
from neuron_lab.device import tensor_data
from neuron_lab.runtime import knobs

N = 4096          # floats: 16 KiB per output


def _step(x):
    return (x * 2 + 1).relu()


def _learn(x, times=3):
    for _ in range(times):
        _step(x)
        neuron_lab.sync()


def test_deferred_outputs_counted_at_issue(compile_off, fresh_engine):
    x = torch.randn(N, device="neuron")
    _learn(x)
    gc.collect()
    base = torch.neuron.memory_allocated()
    y = _step(x)                                          # deferred: nothing has run yet
    assert fresh_engine.seg.records and tensor_data.storage_is_pending(y)
    assert torch.neuron.memory_allocated() == base + N * 4   # temporaries died: only y counts
    assert torch.accelerator.memory.memory_allocated() == torch.neuron.memory_allocated()
    neuron_lab.sync()                                     # the region runs: same bytes, now real
    assert torch.neuron.memory_allocated() == base + N * 4
    assert torch.equal(y.cpu(), _step(x.cpu()))
    stats = torch.neuron.memory_stats()
    assert stats["allocation.all.current"] == stats["allocation.all.allocated"] - \
        stats["allocation.all.freed"]
    del y
    gc.collect()
    assert torch.neuron.memory_allocated() == base


def test_deferred_output_dropped_before_launch_is_freed(compile_off, fresh_engine):
    x = torch.randn(N, device="neuron")
    _learn(x)
    gc.collect()
    base = torch.neuron.memory_allocated()
    y = _step(x)
    del y
    assert torch.neuron.memory_allocated() == base
    neuron_lab.sync()
    assert torch.neuron.memory_allocated() == base


def test_deferred_in_place_view_op_keeps_its_count(compile_off, fresh_engine):
    x = torch.randn(64, 64, device="neuron")

    def body():
        y = x * 3
        y.t_()
        return y
    for _ in range(3):
        body()
        neuron_lab.sync()
    gc.collect()
    base = torch.neuron.memory_allocated()
    y = body()
    assert torch.neuron.memory_allocated() == base + 64 * 64 * 4
    neuron_lab.sync()
    assert torch.neuron.memory_allocated() == base + 64 * 64 * 4
    assert torch.equal(y.cpu(), (x.cpu() * 3).t())


def _chain(x):
    """W2's shape: 20 elementwise ops, each result rebinding ``x`` (the previous one dies)."""
    for i in range(20):
        k = i % 5
        x = (x * 1.001 if k == 0 else x + 0.01 if k == 1 else x.clamp_min(-2.0) if k == 2
             else x - 0.005 if k == 3 else x.abs())
    return x


def _peak_above(x, mode) -> int:
    with neuron_lab.mode(mode):
        neuron_lab.sync()
        gc.collect()
        torch.neuron.reset_peak_memory_stats()
        base = torch.neuron.memory_allocated()
        y = _chain(x)
        neuron_lab.sync()
        peak = torch.neuron.max_memory_allocated() - base
        assert torch.equal(y.cpu(), _chain(x.cpu()))
        del y
    return peak


@pytest.mark.parametrize("fused", [False, True], ids=["per-op", "fused"])
def test_intermediates_inside_a_region_are_never_allocated(fused, fresh_engine):
    x = torch.randn(N, device="neuron")
    with knobs.COMPILE.scoped(fused), knobs.TRIALS.scoped(0):
        for _ in range(4):                       # learn the region (and compile it)
            y = _chain(x)
            neuron_lab.sync()
            del y
        launches = fresh_engine.stats["launches_fused"]
        adaptive = _peak_above(x, "adaptive")
        assert fresh_engine.stats["launches_fused"] == launches + fused
    eager = _peak_above(x, "eager")
    assert eager == 2 * N * 4          # eager holds the previous result while making the next
    assert adaptive == N * 4           # adaptive allocates the region's one live output


def test_a_reported_pending_value_is_never_above_the_peak(compile_off, fresh_engine):
    x = torch.randn(N, device="neuron")
    _learn(x)
    gc.collect()
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    a = x * 2                                    # two live pending outputs
    b = a + 1
    assert fresh_engine.seg.records and tensor_data.storage_is_pending(b)
    now = torch.neuron.memory_allocated()
    assert now == base + 2 * N * 4
    assert torch.neuron.max_memory_allocated() >= now
    del a, b
    neuron_lab.sync()


def test_memory_read_from_another_thread_while_deferring(compile_off, fresh_engine):
    """The telemetry sampler reads memory_allocated() from its own thread while the user's
    thread defers ops: the pending outputs are summed from a snapshot of the queue, and the
    accounting is exact afterwards."""
    import sys
    import threading
    x = torch.randn(N, device="neuron")
    _learn(x)
    gc.collect()
    base = torch.neuron.memory_allocated()
    stop, errors, reads = threading.Event(), [], []

    def reader():
        while not stop.is_set():
            try:
                reads.append(torch.neuron.memory_allocated())
                torch.neuron.memory_stats()
            except Exception as e:  # noqa: BLE001 - reported by the test
                errors.append(e)
                return
    th = threading.Thread(target=reader)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    th.start()
    try:
        for _ in range(300):
            y = _step(x)
            assert y.sum().item() == pytest.approx(_step(x.cpu()).sum().item(), rel=1e-5)
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(old)
    assert not errors, errors[:1]
    assert reads and min(reads) >= base and max(reads) <= base + 4 * N * 4
    del y
    gc.collect()
    assert torch.neuron.memory_allocated() == base
