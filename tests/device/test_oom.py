"""Exceeding the modelled HBM capacity raises ``torch.OutOfMemoryError`` and changes nothing.

The capacity is set per test with ``config.HBM_GB.scoped`` (the ``NEURON_LAB_HBM_GB`` knob) to
what is allocated now plus a small headroom, so the tests do not depend on the host's RAM.
"""
import gc
import re

import pytest
import torch

import neuron_lab
from neuron_lab.device import config

MiB = 1 << 20


@pytest.fixture
def headroom(any_mode):
    """Capacity = allocated + 1 MiB; yields the bytes allocated at the start. A fresh region
    cache: what earlier tests taught the adaptive runtime must not change where an OOM raises."""
    neuron_lab.runtime.reset()
    gc.collect()
    neuron_lab.sync()
    used = torch.neuron.memory_allocated()
    with config.HBM_GB.scoped((used + MiB) / 2**30):
        yield used


def _numbers(msg: str) -> dict:
    return {k: int(v) for k, v in re.findall(r"(\w+)[^(]*\((\d+) bytes\)", msg)}


def test_oom_message_names_requested_allocated_capacity(headroom):
    keep = torch.arange(1024.0, device="neuron")
    ooms = torch.neuron.memory_stats()["num_ooms"]
    with pytest.raises(torch.OutOfMemoryError) as e:
        torch.empty(MiB, device="neuron")                 # 4 MiB > 1 MiB headroom
    msg = str(e.value)
    assert "neuron:0" in msg and "NEURON_LAB_HBM_GB" in msg
    assert f"({4 * MiB} bytes)" in msg                          # requested
    assert f"({headroom + 4096} bytes) allocated" in msg         # allocated
    assert f"({torch.neuron.mem_get_info()[1]} bytes) modelled HBM capacity" in msg
    assert torch.neuron.memory_stats()["num_ooms"] == ooms + 1
    assert torch.equal(keep.cpu(), torch.arange(1024.0))        # every tensor still valid


@pytest.mark.parametrize("how", ["factory", "op", "transfer", "inplace_resize", "backward"])
def test_state_intact_then_free_and_retry(headroom, how):
    keep = torch.randn(64, 64, device="neuron", requires_grad=True)
    ref = keep.detach().cpu()
    big = torch.randn(600, 600)                                  # ~1.4 MiB
    attempts = {
        "factory": lambda: torch.ones(600, 600, device="neuron"),
        "op": lambda: keep.detach().repeat(10, 10),
        "transfer": lambda: big.to("neuron"),
        "inplace_resize": lambda: torch.empty(4, device="neuron").resize_(600, 600),
        "backward": lambda: (keep.repeat(10, 10) * 2).sum().backward(),
    }
    before = torch.neuron.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError):
        attempts[how]()
        neuron_lab.sync()
    gc.collect()
    neuron_lab.sync()
    assert torch.neuron.memory_allocated() <= before + 16        # nothing leaked (a 4-float stub)
    assert torch.equal(keep.detach().cpu(), ref) and keep.grad is None
    assert torch.equal((keep * 2).detach().cpu(), ref * 2)       # still usable
    with config.HBM_GB.scoped((before + 8 * MiB) / 2**30):       # "freed" room: retry succeeds
        attempts[how]()
        neuron_lab.sync()


def test_freeing_makes_room(headroom):
    a = torch.empty(MiB // 8, device="neuron")                   # 512 KiB
    b = torch.empty(MiB // 8, device="neuron")                   # 1 MiB used of the headroom
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(MiB // 8, device="neuron")
    del a
    c = torch.empty(MiB // 8, device="neuron")                   # fits again
    assert c.numel() == b.numel()


def test_capacity_follows_the_knob():
    with config.HBM_GB.scoped(2.0):
        assert torch.neuron.mem_get_info()[1] == 2 << 30
        assert torch.neuron.memory_stats()["capacity_bytes"] == 2 << 30
    host = torch.neuron.mem_get_info()[1]
    assert 0 < host <= 96 << 30


def test_adaptive_oom_while_deferring_leaves_no_phantom_bytes():
    from neuron_lab.runtime import knobs
    neuron_lab.runtime.reset()
    with knobs.COMPILE.scoped(False), neuron_lab.mode("adaptive"):
        keep = torch.randn(64, 64, device="neuron")
        for _ in range(3):                      # the runtime learns both regions: it defers them
            keep.repeat(10, 10)
            neuron_lab.sync()
            (keep * 2).cpu()
        gc.collect()
        used = torch.neuron.memory_allocated()
        with config.HBM_GB.scoped((used + MiB) / 2**30):
            with pytest.raises(torch.OutOfMemoryError):
                keep.repeat(10, 10)             # 1.6 MiB: over capacity, raised at the op
            neuron_lab.sync()
            assert torch.equal((keep * 2).cpu(), keep.cpu() * 2)   # 16 KiB: fits


def _host_allocations(fn) -> list[int]:
    """Bytes of every host (CPU allocator) allocation ``fn`` made, seen by PyTorch's profiler."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with pytest.raises(torch.OutOfMemoryError) as e:
            fn()
    return [ev.cpu_memory_usage for ev in prof.events() if ev.cpu_memory_usage > 0], str(e.value)


BIG = 64 * MiB     # over the 1 MiB headroom, small enough for any host
HOST: list = []


@pytest.mark.parametrize("name,call", [
    ("aten::zeros", lambda: torch.zeros(BIG, dtype=torch.uint8, device="neuron")),
    ("aten::full", lambda: torch.full((BIG // 4,), 2.0, device="neuron")),
    ("aten::randn", lambda: torch.randn(BIG // 4, device="neuron")),
    ("aten::_to_copy", lambda: HOST[0].to("neuron")),                 # a transfer
    ("aten::arange", lambda: torch.arange(BIG // 8, device="neuron")),
    ("aten::empty_permuted", lambda: torch.ones_like(torch.empty(BIG, dtype=torch.uint8,
                                                            device="meta"), device="neuron")),
    ("aten::empty_strided", lambda: torch.empty_strided((BIG // 4, 2), (1, BIG // 4),
                                                        device="neuron")),
    ("aten::repeat", lambda: torch.ones(1024, device="neuron").repeat(BIG // 4096)),
    ("aten::eye", lambda: torch.eye(4096, device="neuron")),
    ("aten::clone", lambda: torch.ones(1024, device="neuron").expand(BIG // 4096, 1024)
     .contiguous()),                                                  # checked in C++ too
    ("aten::cat", lambda: torch.cat([torch.ones(64 << 10, device="neuron")] * (BIG >> 18))),
], ids=lambda v: v if isinstance(v, str) else "")
def test_oom_is_raised_before_the_host_allocates(headroom, name, call):
    """Issue 15: ``torch.zeros(3 GiB)`` on a 1 GiB device zero-filled 3 GiB of host memory
    before raising; the capacity is now checked first (the profiler sees no host allocation of
    the requested size)."""
    HOST[:] = [torch.empty(BIG, dtype=torch.uint8)]      # the transfer's source, made outside
    sizes, msg = _host_allocations(call)
    HOST.clear()
    assert name in msg and "modelled HBM capacity" in msg
    assert not [n for n in sizes if n >= MiB], sizes


def test_larger_than_host_ram_is_out_of_memory_whatever_the_capacity(headroom):
    """A modelled capacity above the host's RAM: the host allocator's failure is reported as
    ``torch.OutOfMemoryError`` (it was a plain RuntimeError), and nothing is counted."""
    one = torch.ones(1, 1, device="neuron")
    before = torch.neuron.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError) as e:
        torch.empty(1 << 50, dtype=torch.uint8, device="neuron")    # 1 PiB, over capacity
    assert "modelled HBM capacity" in str(e.value)
    with config.HBM_GB.scoped(float(1 << 21)):                      # 2 PiB modelled
        with pytest.raises(torch.OutOfMemoryError) as e:
            torch.empty(1 << 50, dtype=torch.uint8, device="neuron")
        with pytest.raises(torch.OutOfMemoryError):
            one.expand(1 << 24, 1 << 24).contiguous()
    msg = str(e.value)
    assert "aten::empty.memory_format" in msg and "1125899906842624 bytes" in msg
    assert "NEURON_LAB_HBM_GB" in msg and "host" in msg
    assert torch.neuron.memory_allocated() == before
