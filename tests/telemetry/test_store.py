"""The telemetry store under concurrency and at its bounds, fed by the real event bus; the
sampler's timeline; per-cell records outside IPython; ``profile(path=...)``."""
import inspect
import json
import threading
import time

import torch

import neuron_lab
from neuron_lab.device import events
from neuron_lab.telemetry import Sampler, cells, store
from neuron_lab.telemetry.store import LAUNCHES_KEPT, SAMPLES_KEPT, Store


def test_concurrent_events_are_all_counted_and_bounded():
    s = Store()
    s.start()
    try:
        def emit():
            for _ in range(1500):
                events.emit(events.LAUNCH, region=-1, ops=1, kind="per-op", seconds=1e-6)
                events.emit(events.SYNC, reason="item")
        threads = [threading.Thread(target=emit) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(s.launches) == LAUNCHES_KEPT            # ring buffer: 6000 emitted
        assert s.syncs["item"] == 6000
        assert abs(s.launch_seconds - 6000e-6) < 1e-9
    finally:
        s.stop()


def test_fallback_events_carry_the_source_line():
    n = store.fallback_seq
    line = inspect.currentframe().f_lineno + 1
    torch.ones(2, device="neuron", dtype=torch.float64).sum()
    assert store.fallback_seq > n
    ev = store.fallback_events[-1]
    assert ev["op"] == "aten::sum" and ev["location"].endswith(f"test_store.py:{line}")
    assert json.loads(json.dumps(neuron_lab.metrics()))["fallback_events"][-1]["op"] == "aten::sum"


def test_sampler_timeline_is_bounded_and_tracks_allocation():
    smp = Sampler(hz=20)
    seen = []
    smp.listeners.append(seen.append)
    smp.start()
    x = torch.empty(1 << 16, device="neuron")
    time.sleep(0.5)
    smp.stop()
    assert len(seen) >= 3 and seen[-1]["allocated"] >= 4 << 16
    assert set(seen[-1]) == {"t", "allocated", "reserved", "peak", "capacity"}
    for _ in range(SAMPLES_KEPT + 10):
        store.sample_memory()
    assert len(store.memory) == SAMPLES_KEPT
    assert smp.set_rate(100) == 20.0 and smp.set_rate(0) == 0.5
    del x


def test_cell_record_outside_ipython():
    cells.start("block-1")
    a = torch.empty(1 << 14, device="neuron")
    (a.fill_(1.0) * 2).sum().item()
    rec = cells.end()
    assert rec["cell_id"] == "block-1" and rec["ops"] >= 3 and rec["peak_bytes"] >= 4 << 14
    assert rec["device_s"] >= 0 and 0 <= rec["fused_share"] <= 1 and store.cells[-1] is rec


def test_profile_path_keyword(tmp_path):
    with neuron_lab.profile(path=str(tmp_path / "p")) as prof:
        (torch.ones(8, device="neuron") + 1).sum().item()
    assert prof.trace_path.startswith(str(tmp_path / "p"))
    json.load(open(prof.trace_path))
