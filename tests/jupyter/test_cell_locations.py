"""Locations in IPython read as IPython's own tracebacks do: ``Cell In[N], line M``.

Every kind of recorded location is checked in a real IPython shell (cells compiled by IPython's
own compiler): fallback rows, sync points by line, region boundaries, the note on a deferred
op's error, the profiler's fallback events; and ``cell_ids`` maps N back to the cell id the
frontend sent. A script keeps ``file.py:line`` (the device tests cover that form).
"""
import sys

import pytest
import torch

import neuron_lab
from neuron_lab.runtime import knobs
from neuron_lab.telemetry import cells, store


@pytest.fixture(autouse=True)
def clean(ip):
    ip.run_line_magic("neuron_reset", "")
    with knobs.COMPILE.scoped(False):
        yield


def run(ip, code, cell_id=None):
    n = ip.execution_count
    r = ip.run_cell(code, store_history=True, cell_id=cell_id)   # as a kernel runs a cell
    return n, r


def test_fallback_sync_and_boundary_read_cell_in_n(ip):
    n, r = run(ip, "import torch\n"
                   "a = torch.ones(4, device='neuron')\n"
                   "for i in range(5):\n"
                   "    s = (a * i).sum().item()\n"
                   "d = torch.ones(3, device='neuron', dtype=torch.float64).sum()\n",
               cell_id="cell-abc")
    r.raise_error()
    row = next(f for f in neuron_lab.fallback_ops() if f["op"] == "aten::sum")
    assert row["locations"] == [f"Cell In[{n}], line 5"]
    assert "dtype=torch.float64" in row["source"][f"Cell In[{n}], line 5"]
    sites = store.sites()
    item = next(s for s in sites["syncs"] if s["reason"] == "item")
    assert item["location"] == f"Cell In[{n}], line 4" and item["count"] == 5
    assert item["source"] == "s = (a * i).sum().item()"
    bound = next(b for b in sites["boundaries"] if b["reason"] == "item")
    assert bound["location"] == f"Cell In[{n}], line 4" and bound["ops"] >= 5
    assert cells.cell_ids[n] == "cell-abc"
    assert store.cells[-1]["execution_count"] == n and store.cells[-1]["cell_id"] == "cell-abc"
    assert f"item x5 at Cell In[{n}], line 4" in neuron_lab.metrics_report()


def test_deferred_error_note_names_the_cell_line(ip):
    code = ("x = torch.randn(8, device='neuron')\n"
            "def gather(idx):\n"
            "    y = x * 2\n"
            "    z = y[idx]\n"
            "    return (z + 1).sum()\n"
            "for _ in range(3):\n"
            "    gather(torch.tensor([1, 2], device='neuron')).item()\n"
            "r = gather(torch.tensor([1, 20], device='neuron'))\n"
            "try:\n"
            "    r.item()\n"
            "except IndexError as e:\n"
            "    note = e.__notes__[0]\n")
    n, r = run(ip, code)
    r.raise_error()
    note = ip.user_ns["note"]
    assert f"issued at Cell In[{n}], line 4: z = y[idx]" in note, note


def test_profiler_fallback_events_read_cell_in_n(ip, tmp_path):
    ip.user_ns["out"] = str(tmp_path / "prof")
    n, r = run(ip, "import neuron_lab\nwith neuron_lab.profile(out) as prof:\n"
                   "    v = torch.ones(2, device='neuron', dtype=torch.float64).mean()\n")
    r.raise_error()
    prof = ip.user_ns["prof"]
    assert {e["location"] for e in prof.fallback_events} == {f"Cell In[{n}], line 3"}
    trace = (tmp_path / "prof" / "trace.json").read_text()
    assert f"Cell In[{n}], line 3" in trace


def test_script_code_keeps_file_and_line():
    before = {(f["op"], f["reason"]) for f in neuron_lab.fallback_ops()}
    line = sys._getframe().f_lineno + 1
    torch.ones(2, device="neuron", dtype=torch.float64).prod()     # this file, this line
    row = next(f for f in neuron_lab.fallback_ops() if f["op"] == "aten::prod"
               and (f["op"], f["reason"]) not in before)
    assert row["locations"][0].endswith(f"test_cell_locations.py:{line}")


def test_profiled_cell_body_keeps_its_cell_and_lines(ip):
    n, r = run(ip, "%%neuron_profile\n"
                   "w = torch.ones(4, device='neuron')\n"
                   "q = torch.ones(2, device='neuron', dtype=torch.float64).cumsum(0)\n")
    r.raise_error()
    row = next(f for f in neuron_lab.fallback_ops() if f["op"] == "aten::cumsum")
    assert row["locations"] == [f"Cell In[{n}], line 3"]
    assert ip.execution_count == n + 1                 # the shell's own count is untouched
