"""Memory accounting of deferred outputs: counted when handed out (as CUDA counts a kernel's
output at issue), moved onto the host storage when the region runs, freed when they die."""
import gc

import torch

import neuron_lab

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
    assert fresh_engine.records and y.untyped_storage()._h is None
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
