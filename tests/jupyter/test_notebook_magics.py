"""``%load_ext neuron_lab`` and the magics in a real kernel, through nbclient.

One notebook built here (not a tutorial, so the checks stay next to what they check), run in a
fresh ipykernel from this interpreter (``kernel_manager`` in ``conftest.py``). Each
magic's *rendered output* is checked for real values: bytes, op names, the fallback's source
line, the mode switch, the per-cell records the hooks wrote.
"""
import json

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

CELLS = [
    "%load_ext neuron_lab\nimport torch, neuron_lab\nneuron_lab.clear_op_tracking()",
    "x = torch.empty(1024, device='neuron')\n%neuron_memory",
    "y = torch.ones(3, device='neuron', dtype=torch.float64).sum()",
    "%neuron_fallbacks",
    "%%neuron_profile --top 3\nz = torch.ones(64, device='neuron')\n(z * 2 + 1).sum().item()",
    "%neuron_mode eager",
    "print(neuron_lab.get_mode())\n%neuron",
    "from neuron_lab.telemetry import store\nprint([c['ops'] for c in store.cells][-3:])",
    "%unload_ext neuron_lab\nprint('neuron_fallbacks' in get_ipython().magics_manager.magics['line'])",
]


def _text(cell) -> str:
    parts = []
    for o in cell.outputs:
        if o.get("output_type") == "stream":
            parts.append(o["text"])
        elif "data" in o:
            parts.append(o["data"].get("text/plain", ""))
            parts.append(o["data"].get("text/html", ""))
    return "\n".join(parts)


@pytest.fixture
def executed(kernel_manager, tmp_path):
    km = kernel_manager
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    client = nbclient.NotebookClient(nb, km=km, timeout=120, startup_timeout=120,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    return [_text(c) for c in nb.cells]


def test_magics_in_a_real_kernel(executed):
    out = executed
    assert "Allocated memory" in out[1] and "4.00 KiB" in out[1]          # 1024 float32
    assert "aten::sum" in out[3] and "float64" in out[3]
    assert "y = torch.ones(3, device=&#x27;neuron&#x27;, dtype=torch.float64).sum()" in out[3] \
        or "y = torch.ones(3, device='neuron', dtype=torch.float64).sum()" in out[3]
    assert "<table>" in out[3]                                            # rich output
    assert "aten::mul.Tensor" in out[4] and "launches" in out[4]
    assert "neuron mode: eager" in out[5]
    assert out[6].splitlines()[0] == "eager" and "neuron:0" in out[6]
    ops = json.loads(out[7].strip().splitlines()[-1])
    assert len(ops) == 3 and all(isinstance(n, int) for n in ops)         # per-cell records
    assert out[8].strip().splitlines()[-1] == "False"                     # unload removed them
