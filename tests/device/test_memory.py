"""Exact device memory accounting: bytes of each storage, once, from allocation until it dies.

Every test measures deltas from the bytes allocated when it starts (other tests' tensors may be
alive), with the cycle collector paused so garbage from earlier tests cannot die mid-test.
"""
import gc

import pytest
import torch

import neuron_lab


@pytest.fixture(scope="module", autouse=True)
def collected():
    gc.collect()


@pytest.fixture(autouse=True)
def base(any_mode):
    neuron_lab.sync()
    gc.disable()            # no cycle from an earlier test may die while this one measures
    try:
        yield torch.neuron.memory_allocated()
    finally:
        gc.enable()


def used(base):
    neuron_lab.sync()
    return torch.neuron.memory_allocated() - base


@pytest.mark.parametrize("dtype,size", [(torch.float32, 4), (torch.bfloat16, 2), (torch.float16, 2),
                                        (torch.int8, 1), (torch.int64, 8), (torch.bool, 1)])
def test_allocation_bytes_by_dtype(base, dtype, size):
    x = torch.zeros(1000, dtype=dtype, device="neuron")
    assert used(base) == 1000 * size
    del x
    assert used(base) == 0


def test_views_are_not_counted_twice(base):
    x = torch.empty(1024, device="neuron")
    views = [x.view(32, 32), x[10:], x.view(32, 32).t(), x.unsqueeze(0), x.as_strided((4,), (2,)),
             x.view(torch.int32), x.split(100)[3], x.detach(), x.data]
    assert used(base) == 4096
    del x
    assert used(base) == 4096                   # the views keep the storage alive
    del views
    assert used(base) == 0


def test_ops_allocate_outputs_inplace_does_not(base):
    a = torch.ones(256, device="neuron")
    b = a * 2                                   # a new 1 KiB output
    assert used(base) == 2048
    a.add_(b).mul_(3)                           # in place: nothing new
    c = torch.add(a, 1, out=b)                  # out=: writes into b
    assert c is b and used(base) == 2048
    del a, b, c
    assert used(base) == 0


def test_resize_and_copy_to_host(base):
    x = torch.empty(10, device="neuron")
    x.resize_(100)
    assert used(base) == 400
    y = x.cpu()                                  # host copies are not device memory
    assert used(base) == 400 and y.device.type == "cpu"
    del x
    assert used(base) == 0


def test_autograd_saved_tensors_freed_with_the_graph(base):
    w = torch.randn(64, 64, device="neuron", requires_grad=True)
    loss = (w.tanh() @ w).sum()
    assert used(base) > 64 * 64 * 4
    loss.backward()
    del loss
    assert used(base) == 2 * 64 * 64 * 4         # w and w.grad
    w.grad = None
    assert used(base) == 64 * 64 * 4


def test_peak_reset_and_reserved(base):
    torch.neuron.reset_peak_memory_stats()
    peak0 = torch.neuron.max_memory_allocated()
    x = torch.empty(1 << 20, device="neuron")   # 4 MiB
    assert torch.neuron.max_memory_allocated() - peak0 == 4 << 20
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated()
    assert torch.neuron.memory_reserved() % (2 << 20) == 0            # 2 MiB segments
    del x
    assert torch.neuron.max_memory_allocated() - peak0 == 4 << 20       # peak stays
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == torch.neuron.memory_allocated()
    before = torch.neuron.memory_reserved()
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() <= before
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated()
    assert torch.neuron.max_memory_reserved() >= torch.neuron.memory_reserved()


CUDA_KEYS = [f"{m}.all.{s}" for m in ("allocated_bytes", "reserved_bytes", "active_bytes",
                                      "allocation") for s in ("current", "peak", "allocated", "freed")]


def test_memory_stats_keys_like_cuda(base):
    s = torch.neuron.memory_stats()
    for key in CUDA_KEYS + ["num_ooms", "num_alloc_retries"]:
        assert key in s, key
    x = torch.empty(100, device="neuron")
    s2 = torch.neuron.memory_stats()
    assert s2["allocated_bytes.all.current"] - s["allocated_bytes.all.current"] == 400
    assert s2["allocation.all.allocated"] - s["allocation.all.allocated"] == 1
    del x
    assert torch.neuron.memory_stats()["allocated_bytes.all.freed"] - \
        s2["allocated_bytes.all.freed"] == 400


def test_summary_and_mem_get_info(base):
    x = torch.empty(3 << 20, dtype=torch.uint8, device="neuron")
    text = torch.neuron.memory_summary()
    assert "Allocated memory" in text and "Reserved memory" in text and "MiB" in text
    assert "capacity" in text and len(text.splitlines()) >= 6
    free, total = torch.neuron.mem_get_info()
    assert total == torch.neuron.get_device_properties().total_memory
    assert free == total - torch.neuron.memory_reserved()
    del x



def test_a_storage_freed_by_the_gc_while_accounting_does_not_deadlock():
    """The cyclic GC can run inside memory accounting (the Python counter allocates tuples and
    weakrefs) and free a storage there, whose uncount re-enters the counter on the same thread.
    Checked on the device's counter and on the Python one (the fallback without the native
    extension), with the lock held as the counter holds it."""
    import gc
    import threading
    from neuron_lab.device import counting

    class Cycle:
        pass
    done = threading.Event()
    py = counting.PyCounter()

    def body():
        gc.collect()
        before = torch.neuron.memory_allocated()
        old = gc.get_threshold()
        gc.set_threshold(1)              # collect at (almost) every allocation
        try:
            for _ in range(50):
                c = Cycle()
                c.me, c.t = c, torch.ones(64, device="neuron")   # freed only by the GC
                c.s = torch.ones(64).untyped_storage()
                py.count_storage(c.s, -1)
                del c
                with py.lock:            # the uncount must be able to take the lock again
                    py.count_storage(torch.empty(0).untyped_storage(), -1)
        finally:
            gc.set_threshold(*old)
        gc.collect()
        assert torch.neuron.memory_allocated() == before
        assert py.allocated_bytes() == 0 and py.memory_totals()[8] == 0
        done.set()
    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(60)
    assert done.is_set(), "memory accounting deadlocked"
