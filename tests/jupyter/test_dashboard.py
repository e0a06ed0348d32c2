"""The ipywidgets dashboard builds from real telemetry and refreshes from the sampler."""
import torch

import neuron_lab
from neuron_lab.jupyter.dashboard import Dashboard


def test_dashboard_shows_memory_fallbacks_and_regions():
    x = torch.empty(2048, device="neuron")
    torch.ones(2, device="neuron", dtype=torch.float64).sum()
    d = neuron_lab.dashboard()
    assert isinstance(d, Dashboard)
    assert 0 < d.gauge.value <= 1 and "allocated" in d.gauge_label.value
    assert "aten::sum" in d.fallbacks.value and "<table>" in d.regions.value
    assert d.timeline.value[:4] == b"\x89PNG"
    before = d.gauge.value
    y = torch.empty(1 << 20, device="neuron")
    d.refresh()
    assert d.gauge.value > before
    del x, y
