"""The two storage counters behind device memory accounting: the native one
(``csrc/accounting.cpp``, DataPtr-wrapping, used on the CPU executor) and the Python fallback
(``device/counting.py``, weak references). Both must agree on every operation; the native one
must keep a storage's bytes intact (copy-on-write materialized, resize, free in any thread)."""
import gc
import threading

import pytest
import torch

from neuron_lab.device import counting, memory, native


@pytest.fixture(params=["native", "python"])
def counter(request):
    if request.param == "python":
        return counting.PyCounter()
    ext = native.load()
    if memory._counter is not ext:
        pytest.skip("the native counter is not in use (no extension, or the CUDA executor)")
    return ext


def _totals(c) -> dict:
    names = ("allocated", "peak", "reserved", "reserved_peak", "n_alloc", "n_free",
             "bytes_alloc", "bytes_freed", "live", "peak_live")
    return dict(zip(names, c.memory_totals()))


def test_count_free_and_recount_agree(counter):
    gc.collect()
    t0 = _totals(counter)
    a, b = torch.ones(256), torch.ones(64)
    sa, sb = a.untyped_storage(), b.untyped_storage()
    assert counter.count_storage(sa, -1) == 1024
    assert counter.count_storage(sa, -1) == 0                 # counted once
    assert counter.counted_bytes(sa) == 1024 and counter.counted_bytes(sb) == -1
    assert counter.count_storage(sb, t0["allocated"] + 1024) == -1   # past that capacity
    assert counter.counted_bytes(sb) == -1                   # ...and nothing changed
    assert counter.count_storage(sb, -1) == 256
    t1 = _totals(counter)
    assert t1["allocated"] == t0["allocated"] + 1280 and t1["live"] == t0["live"] + 2
    sa.resize_(2048)                                        # a resize reallocates the bytes
    assert counter.count_storage(sa, -1) in (2048, 1024)     # native: new bytes; Python: growth
    assert counter.counted_bytes(sa) == 2048
    assert _totals(counter)["allocated"] == t0["allocated"] + 2048 + 256
    del a, b, sa, sb
    gc.collect()
    t2 = _totals(counter)
    assert t2["allocated"] == t0["allocated"] and t2["live"] == t0["live"]
    assert t2["bytes_alloc"] - t0["bytes_alloc"] == t2["bytes_freed"] - t0["bytes_freed"]
    assert t2["peak"] >= t0["allocated"] + 2048 + 256


def test_a_storage_freed_in_another_thread_is_uncounted(counter):
    gc.collect()
    base = counter.allocated_bytes()
    ts = [torch.ones(128) for _ in range(8)]
    for t in ts:
        counter.count_storage(t.untyped_storage(), -1)
    del t
    assert counter.allocated_bytes() == base + 8 * 512

    def drop():
        ts.clear()
    th = threading.Thread(target=drop)
    th.start()
    th.join()
    gc.collect()
    assert counter.allocated_bytes() == base


def test_a_copy_on_write_storage_is_materialized_before_counting():
    """A lazily cloned storage shares its bytes until one side writes; counting it (the native
    counter wraps its DataPtr) must not make a later write reach the other tensor."""
    a = torch.arange(8.0)
    b = torch._lazy_clone(a)
    memory.track(b.untyped_storage())
    b.add_(100)
    assert a.tolist() == list(map(float, range(8)))
    assert b.tolist() == [x + 100.0 for x in range(8)]
    assert memory.counted_bytes(b.untyped_storage()) == 32
