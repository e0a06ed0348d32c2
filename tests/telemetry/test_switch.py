"""enable_all()/disable_all(): what the benchmark's W1T turns on and off, really on and off."""
import threading
import time

import torch

import neuron_lab  # noqa: F401
from neuron_lab import telemetry as tel
from neuron_lab.device import events


def test_everything_on_then_off():
    tel.disable_all()
    assert not events.active() and not tel.enabled()        # nobody on the bus
    t0 = time.time()
    tel.enable_all(hz=20)
    try:
        assert events.active() and tel.cells.running
        assert any(t.name == "neuron_lab-sampler" for t in threading.enumerate())
        for _ in range(3):               # a region's repeats are launches (its first run: a flush)
            (torch.ones(64, device="neuron") * 2).sum().item()
        assert any(r["t"] >= t0 for r in tel.store.launches) and tel.store.syncs.get("item", 0) >= 1
    finally:
        rec = tel.disable_all()
        tel.store.start()                                    # the import-time default
    assert rec["cell_id"] == "telemetry-on" and rec["ops"] >= 3
    assert not any(t.name == "neuron_lab-sampler" and t.is_alive() for t in threading.enumerate())
    assert not tel.enabled() and not tel.cells.running
