"""The panel's "Compiled graphs" section (snapshot ``compiled``) for a function compiled in a
notebook cell: the graph break and the recompile are at ``Cell In[N], line M`` of the cell that
defines the function, with the break's reason and the failed guard."""
from neuron_lab.compile import outcomes
from neuron_lab.jupyter.comm import snapshot_body

DEFINE = """\
import torch
def branchy(x, w):
    y = x @ w
    if y.sum() > 0:
        y = y * 2
    return y.relu().sum(dim=-1)
f = torch.compile(branchy, backend="neuron")
w = torch.randn(6, 6).to("neuron")
"""


def test_graph_break_and_recompile_rows_point_at_the_cell(ip):
    outcomes.clear()
    n = ip.execution_count
    ip.run_cell(DEFINE, store_history=True).raise_error()
    ip.run_cell("f(torch.rand(4, 6).to('neuron'), w)\nf(torch.rand(5, 6).to('neuron'), w)\n",
                store_history=True).raise_error()
    c = snapshot_body()["compiled"]
    assert c["programs"] >= 2 and c["graph_breaks"] >= 1 and c["recompiles"] >= 1
    assert c["compile_s"] > 0
    kinds = {r["kind"]: r for r in c["rows"]}
    brk = kinds["graph break"]
    assert brk["location"] == f"Cell In[{n}], line 4" and brk["detail"]
    rec = kinds["recompile"]
    assert rec["location"].startswith(f"Cell In[{n}], line ") and "branchy" in rec["detail"] and "size mismatch" in rec["detail"]
