"""The ipywidgets dashboard builds from real telemetry, and it is live: with the extension
loaded, the sampler thread moves its gauge *while a cell is still running*, and a finished
cell lands in its table and figure."""
import time

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

import neuron_lab
from neuron_lab.jupyter.dashboard import Dashboard, sparkline


def test_dashboard_shows_memory_fallbacks_and_regions():
    x = torch.empty(2048, device="neuron")
    torch.ones(2, device="neuron", dtype=torch.float64).sum()
    d = Dashboard()
    assert 0 < d.gauge.value <= 1 and "allocated" in d.gauge_label.value
    assert "aten::sum" in d.fallbacks.value and "<table>" in d.regions.value
    assert d.timeline.value[:4] == b"\x89PNG"
    before = d.gauge.value
    y = torch.empty(1 << 20, device="neuron")
    d.refresh()
    assert d.gauge.value > before
    assert "<polyline" in sparkline([[0, 1], [1, 4096]]) and "4.00 KiB" in sparkline([[0, 1], [1, 4096]])
    d.close()
    del x, y


@pytest.fixture
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "neuron_lab")
    yield shell
    shell.run_line_magic("unload_ext", "neuron_lab")


def test_dashboard_updates_while_a_cell_runs(ip):
    d = neuron_lab.dashboard()
    ip.user_ns["d"] = d
    r = ip.run_cell("import time, torch\nticks0, g0 = d.ticks, d.gauge.value\n"
                    "big = torch.empty(1 << 22, device='neuron')\n"     # 16 MiB
                    "time.sleep(1.0)\n"
                    "live = (d.ticks - ticks0, d.gauge.value > g0, d.running.value)\n")
    r.raise_error()
    ticks, grew, running = ip.user_ns["live"]
    assert ticks >= 2 and grew, (ticks, grew)                   # refreshed mid-cell, by the thread
    assert running.startswith("running") and "ops" in running
    deadline = time.time() + 20                                 # the figure is drawn on a thread
    while time.time() < deadline and "idle" not in d.running.value:
        time.sleep(0.05)
    assert "idle" in d.running.value and "<td>" in d.cells.value
    d.close()
    assert d.tick not in neuron_lab.jupyter.extension._state["sampler"].listeners
    del ip.user_ns["big"]
