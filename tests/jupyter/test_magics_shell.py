"""Magics in a real IPython shell: each output carries real values."""
import re

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

import neuron_lab


def run(ip, code):
    r = ip.run_cell(code)
    r.raise_error()
    return r.result


def test_status_and_mode(ip):
    assert "neuron:0" in repr(ip.run_line_magic("neuron", ""))
    assert "eager" in repr(ip.run_line_magic("neuron_mode", "eager"))
    assert neuron_lab.get_mode() == "eager"
    ip.run_line_magic("neuron_mode", "adaptive")
    assert neuron_lab.get_mode() == "adaptive"


def test_memory_and_fallbacks_show_bytes_and_source_line(ip):
    run(ip, "import torch\nneuron_lab_x = torch.empty(1024, device='neuron')")
    assert "Allocated memory" in repr(ip.run_line_magic("neuron_memory", ""))
    assert torch.neuron.memory_allocated() >= 4096
    ip.run_line_magic("neuron_reset", "")
    run(ip, "neuron_lab_y = torch.ones(3, device='neuron', dtype=torch.float64).sum()")
    table = ip.run_line_magic("neuron_fallbacks", "")
    text, html = repr(table), table._repr_html_()
    assert "aten::sum" in text and "float64" in text
    assert "neuron_lab_y = torch.ones(3" in text and "<table>" in html
    assert any(re.fullmatch(r"Cell In\[\d+\], line 1", loc) for row in table.rows for loc in row["where"])


def test_profile_cell_and_regions(ip, tmp_path):
    out = ip.run_cell_magic("neuron_profile", f"--top 5 --export {tmp_path}",
                            "x = torch.ones(64, device='neuron')\nfor _ in range(4):\n"
                            "    (x * 2 + 1).sum().item()\n"
                            "d = torch.ones(2, device='neuron', dtype=torch.float64).mean()\n")
    text = repr(out)
    assert "aten::mul.Tensor" in text and "launches" in text and "trace:" in text
    assert (tmp_path / "trace.json").exists()
    regions, fallbacks = out.sections
    assert regions.rows and max(r["hits"] for r in regions.rows) >= 2   # the loop's region repeats
    mean = next(r for r in fallbacks.rows if r["op"] == "aten::mean")
    # line 5 of the cell: its first line is the %%neuron_profile line
    assert re.fullmatch(r"Cell In\[\d+\], line 5", mean["where"][0]) and "dtype=torch.float64).mean()" in mean["code"]
    assert "fallbacks in this profile" in out._repr_html_()
    assert "neuron region cache" in repr(ip.run_line_magic("neuron_regions", ""))


def test_per_cell_records(ip):
    from neuron_lab.telemetry import store
    n = len(store.cells)
    run(ip, "z = (torch.ones(128, device='neuron') * 3).sum().item()")
    rec = store.cells[-1]
    assert len(store.cells) == n + 1 and rec["ops"] >= 3 and rec["wall_s"] > 0
    assert rec["peak_bytes"] >= 512


def test_unload_is_symmetric():
    import threading
    from neuron_lab.jupyter import extension
    shell = InteractiveShell.instance()
    n_pre = len(shell.events.callbacks["pre_run_cell"])
    shell.run_line_magic("unload_ext", "neuron_lab")
    assert "neuron" not in shell.magics_manager.magics["line"]
    assert "neuron_profile" not in shell.magics_manager.magics["cell"]
    assert len(shell.events.callbacks["pre_run_cell"]) == n_pre - 1 and not extension._state
    assert not any(t.name in ("neuron_lab-sampler", "neuron_lab-watch")
                   for t in threading.enumerate() if t.is_alive()), threading.enumerate()
    shell.run_line_magic("load_ext", "neuron_lab")
    assert "neuron" in shell.magics_manager.magics["line"]
    assert extension._state["watcher"].alive


def test_line_profile_takes_the_statement_verbatim(ip):
    run(ip, "pv = torch.ones(8, device='neuron')")
    out = ip.run_line_magic("neuron_profile", "--top 2 pw = (pv * -2).sum().item()")
    assert ip.user_ns["pw"] == -16.0                            # "-2" was not read as an option
    assert len(out.rows) <= 2 and "aten::mul.Tensor" in repr(out)


def test_a_failing_cell_end_flush_is_shown_and_the_hooks_survive(ip, monkeypatch):
    import importlib
    from neuron_lab.telemetry import cells, store
    cells_module = importlib.import_module("neuron_lab.telemetry.cells")

    def boom(reason="synchronize"):
        raise RuntimeError("deferred op failed")
    monkeypatch.setattr(cells_module.runtime, "sync", boom)
    ip.run_cell("e1 = torch.ones(4, device='neuron') + 1", cell_id="bad")
    monkeypatch.undo()
    assert store.cells[-1]["cell_id"] == "bad"
    assert store.cells[-1]["error"] == "RuntimeError: deferred op failed"
    assert not cells.running                                    # not stuck "running"
    run(ip, "e2 = (torch.ones(4, device='neuron') * 2).sum().item()")
    assert store.cells[-1]["error"] is None and store.cells[-1]["ops"] >= 2


def test_cell_id_keys_the_record_and_a_profiled_cell_is_one_record(ip):
    from neuron_lab.telemetry import store
    n = len(store.cells)
    ip.run_cell("w = torch.ones(8, device='neuron').sum().item()", cell_id="cell-abc")
    assert store.cells[-1]["cell_id"] == "cell-abc"
    ip.run_cell("%%neuron_profile\nimport time\nv = torch.ones(8, device='neuron') * 2\n"
                "time.sleep(0.2)", cell_id="cell-prof")
    rec = store.cells[-1]
    assert len(store.cells) == n + 2 and rec["cell_id"] == "cell-prof"   # not the nested run
    assert rec["wall_s"] >= 0.2 and rec["ops"] >= 2
