"""Exact memory accounting against the modelled HBM, and OOM that leaves every tensor valid."""
import gc

import pytest
import torch

import neuron_lab
from neuron_lab.device import config


@pytest.fixture(autouse=True)
def eager():
    with neuron_lab.mode("eager"):
        gc.collect()
        yield


def test_exact_bytes_views_and_frees():
    base = torch.neuron.memory_allocated()
    x = torch.empty(1024, device="neuron")                     # 4096 bytes
    assert torch.neuron.memory_allocated() - base == 4096
    v = x.view(32, 32)[1:].t()                                   # views: no new bytes
    assert torch.neuron.memory_allocated() - base == 4096
    y = torch.empty(10, dtype=torch.bfloat16, device="neuron")   # 20 bytes
    assert torch.neuron.memory_allocated() - base == 4116
    del x
    assert torch.neuron.memory_allocated() - base == 4116        # the view keeps the storage
    del v
    assert torch.neuron.memory_allocated() - base == 20
    del y
    assert torch.neuron.memory_allocated() == base


def test_peak_reset_stats_summary_mem_info():
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    x = torch.empty(1 << 20, device="neuron")
    del x
    assert torch.neuron.max_memory_allocated() - base == 4 << 20
    s = torch.neuron.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                "reserved_bytes.all.current", "num_ooms", "allocation.all.allocated"):
        assert key in s
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated()
    torch.neuron.empty_cache()
    free, total = torch.neuron.mem_get_info()
    assert total == torch.neuron.get_device_properties().total_memory and 0 < free <= total
    assert "Allocated memory" in torch.neuron.memory_summary()
    assert torch.accelerator.memory.memory_allocated() == torch.neuron.memory_allocated()


def test_oom_names_sizes_and_keeps_tensors_valid():
    keep = torch.arange(1024.0, device="neuron")
    used = torch.neuron.memory_allocated()
    with config.HBM_GB.scoped((used + (1 << 20)) / 2**30):      # 1 MiB headroom
        with pytest.raises(torch.OutOfMemoryError) as e:
            torch.empty(1 << 20, device="neuron")                 # 4 MiB
        msg = str(e.value)
        assert "neuron:0" in msg and "4194304 bytes" in msg and "capacity" in msg
        assert torch.equal(keep.cpu(), torch.arange(1024.0))       # still valid
        assert torch.neuron.memory_allocated() == used             # nothing leaked
        small = torch.empty(1 << 16, device="neuron")              # fits: retry works
        assert small.numel() == 1 << 16
