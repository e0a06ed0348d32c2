"""The advisor in a real kernel: a notebook (executed by nbclient in ipykernel, whose cells are
compiled to /tmp/ipykernel_*/<hash>.py) provokes each kind of finding in its own cell, and
``neuron_lab.advise()`` names each at that cell's ``Cell In[N], line M``. Compiling is off in
the kernel (no test waits on inductor); the modelled HBM is 64 MiB so one cell can come near it.
"""
import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

CELLS = [
    "%load_ext neuron_lab\nimport time, torch, neuron_lab\na = torch.randn(64, 64, device='neuron')",
    # 1: host sync in a loop (line 2), which also cuts the loop into regions too short to fuse
    "for i in range(10):\n    s = (a + 1).sum().item()",
    # 2: a hot fallback (line 2)
    "for i in range(4):\n    b = a.double() * 2",
    # 3: recompiles: the shape changes every call (line 2)
    "for k in range(4, 10):\n    z = (torch.ones(k, device='neuron') * 2 + 1).relu().sum().item()",
    # 4: memory near the 64 MiB capacity
    "big = torch.empty(58 << 20, dtype=torch.uint8, device='neuron')\ndel big",
    # 5: host-bound: Python work between launches (line 3)
    "for i in range(20):\n    time.sleep(0.01)\n    (a * 2 + 1).relu().sum().item()",
    "found = neuron_lab.advise()\nimport json; print(json.dumps(found))",
]


def test_each_kind_is_found_at_its_cell_and_line(kernel_manager, tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    env = {**os.environ, "NEURON_LAB_COMPILE": "0", "NEURON_LAB_HBM_GB": "0.0625"}
    kernel_manager.start_kernel(cwd=str(tmp_path), env=env)
    try:
        client = nbclient.NotebookClient(nb, km=kernel_manager, timeout=120)
        client.execute()
    finally:
        kernel_manager.shutdown_kernel(now=True)
    import json
    found = json.loads(nb.cells[-1].outputs[-1]["text"])
    at = {}
    for f in found:
        at.setdefault(f["kind"], []).append(f["where"])
    n = [c.execution_count for c in nb.cells]
    assert f"Cell In[{n[1]}], line 2" in at["host-sync-in-loop"], at
    assert f"Cell In[{n[1]}], line 2" in at["region-never-fuses"], at
    assert f"Cell In[{n[2]}], line 2" in at["fallback-hot"], at
    assert f"Cell In[{n[3]}], line 2" in at["recompiles"], at
    assert at["memory-near-capacity"] == [f"Cell In[{n[4]}]"], at
    assert f"Cell In[{n[5]}], line 3" in at["host-bound"], at
    assert found[0]["kind"] == "memory-near-capacity"
    costs = [f["modelled_s"] for f in found[1:]]
    assert costs == sorted(costs, reverse=True)
