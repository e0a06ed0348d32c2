"""``neuron_lab.advise()`` and ``%neuron_advise``: each kind of finding, provoked by a cell in a
real IPython shell, is found at the line (or cell) that caused it, with a fix and a modelled
cost; findings are ranked. Compiling is off (knob) so no test waits on inductor; the
"never fuses" reasons that need a compile (failed, slower) read the region's status, which the
runtime tests cover.
"""
import pytest
import torch

import neuron_lab
from neuron_lab.device import config
from neuron_lab.runtime import knobs


@pytest.fixture(autouse=True)
def clean(ip):
    ip.run_line_magic("neuron_reset", "--cache")
    with knobs.COMPILE.scoped(False):
        yield
    ip.run_line_magic("neuron_reset", "--cache")


def cell(ip, code):
    n = ip.execution_count
    r = ip.run_cell(code, store_history=True)
    r.raise_error()
    return n


def by_kind(kind):
    return [f for f in neuron_lab.advise() if f["kind"] == kind]


SETUP = "import torch, time\na = torch.randn(64, 64, device='neuron')\n"


def test_sync_in_a_loop_and_the_short_regions_it_makes(ip):
    n = cell(ip, SETUP + "for i in range(10):\n"
                         "    s = (a + 1).sum().item()\n")
    (f,) = by_kind("host-sync-in-loop")
    assert f["where"] == f"Cell In[{n}], line 4" and f["count"] == 10
    assert ".item()" in f["message"] and "detach" in f["fix"]
    assert f["modelled_s"] == pytest.approx(10 * neuron_lab.cost_model().params.launch_overhead_s)
    (r,) = by_kind("region-never-fuses")
    assert r["where"] == f"Cell In[{n}], line 4"
    assert "fewer than NEURON_LAB_MIN_REGION_OPS" in r["message"] and r["modelled_s"] > 0


def test_hot_fallback(ip):
    n = cell(ip, SETUP + "for i in range(5):\n"
                         "    b = a.double() * 2\n")
    (f,) = [f for f in by_kind("fallback-hot") if "float64" in f["message"]][:1]
    assert f["where"] == f"Cell In[{n}], line 4" and f["count"] >= 5
    assert "float32" in f["fix"]


def test_region_that_never_fuses_because_compiling_is_off(ip):
    n = cell(ip, SETUP + "for i in range(6):\n"
                         "    y = ((a * 2 + 1).relu() - a).abs()\n"
                         "    y.sum().item()\n")
    (r,) = by_kind("region-never-fuses")
    assert "NEURON_LAB_COMPILE=0" in r["message"]
    assert r["where"] == f"Cell In[{n}], line 5"          # the region ends with the sum
    assert r["count"] == 5                                  # recorded once, launched 5 times


def test_recompiles_when_shapes_change(ip):
    n = cell(ip, SETUP + "for k in range(4, 10):\n"
                         "    z = (torch.ones(k, device='neuron') * 2 + 1).relu().sum().item()\n")
    (f,) = by_kind("recompiles")
    assert f["where"] == f"Cell In[{n}], line 4" and f["count"] == 6
    assert "6 different regions" in f["message"] and "bucket" in f["fix"]


def test_memory_near_capacity_ranks_first(ip):
    with config.HBM_GB.scoped(0.01):                     # ~10 MiB modelled HBM
        n = cell(ip, "import torch\nbig = torch.empty(9 << 20, dtype=torch.uint8, device='neuron')\n"
                     "for i in range(4):\n    (big[:8] + 1).sum().item()\n")
        found = neuron_lab.advise()
        assert found[0]["kind"] == "memory-near-capacity"
        assert found[0]["where"] == f"Cell In[{n}]" and "%" in found[0]["message"]
        ip.run_cell("del big")


def test_host_bound_cell(ip):
    n = cell(ip, SETUP + "for i in range(20):\n"
                         "    time.sleep(0.01)              # host work between launches\n"
                         "    (a * 2 + 1).relu().sum().item()\n")
    (f,) = by_kind("host-bound")
    assert f["where"] == f"Cell In[{n}], line 5"
    assert f["modelled_s"] >= 0.15 and "idle" in f["message"]


def test_ranking_and_the_magic(ip):
    cell(ip, SETUP + "for i in range(30):\n"
                     "    s = (a + i).sum().item()\n"
                     "for i in range(3):\n"
                     "    b = a.double()\n")
    found = neuron_lab.advise()
    costs = [f["modelled_s"] for f in found]
    assert costs == sorted(costs, reverse=True) and len(found) >= 3
    assert set(found[0]) == {"kind", "where", "message", "fix", "modelled_s", "count"}
    table = ip.run_line_magic("neuron_advise", "--top 2")
    text = repr(table)
    assert "host-sync-in-loop" in text and "trn2 cost" in text and len(table.rows) == 2


def test_host_bound_script_without_cells(ip):
    """A script has no cell records: the recorded launches' span is judged instead, at the line
    where the regions ended."""
    import sys
    import time
    a = torch.randn(64, 64, device="neuron")
    line = sys._getframe().f_lineno + 3
    for _ in range(20):
        time.sleep(0.005)                                   # host work between launches
        (a * 2 + 1).relu().sum().item()
    (f,) = by_kind("host-bound")
    assert f["where"].endswith(f"test_advise.py:{line}") and f["count"] >= 19
    assert "idle" in f["message"] and f["modelled_s"] >= 0.05
