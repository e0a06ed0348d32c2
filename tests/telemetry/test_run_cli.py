"""`python -m neuron_lab run` prints the report and exits with the script's code."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args):
    return subprocess.run([sys.executable, "-m", "neuron_lab", "run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_run_prints_report_and_keeps_exit_code(tmp_path):
    out = tmp_path / "m.json"
    p = _run("--json", str(out), "examples/train_mlp.py", "--steps", "12", "--fail")
    assert p.returncode == 3, p.stderr[-2000:]
    assert "step   0 loss" in p.stdout
    assert "Metric: Launches" in p.stderr and "aten::addmm" in p.stderr
    m = json.loads(out.read_text())
    assert m["executed_ops"]["aten::addmm"] >= 12


def test_run_reports_exceptions_as_exit_1(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("import torch\nx = torch.ones(2, device='neuron')\nraise ValueError('boom')\n")
    p = _run(str(script))
    assert p.returncode == 1 and "ValueError: boom" in p.stderr
