"""`python -m neuron_lab run` prints the report and exits with the script's code.

One real subprocess (the example script, exit code 3 through ``SystemExit``); the other exit
paths run ``run()`` in this process, which is what the subprocess calls, to keep the file fast.
"""
import json
import os
import subprocess
import sys

import pytest

from neuron_lab.__main__ import progress_line, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_run_prints_report_and_keeps_exit_code(tmp_path):
    out = tmp_path / "m.json"
    p = subprocess.run([sys.executable, "-m", "neuron_lab", "run", "--json", str(out),
                        "examples/train_mlp.py", "--steps", "12", "--fail"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 3, p.stderr[-2000:]
    assert "step   0 loss" in p.stdout and "Metric:" not in p.stdout   # report on stderr
    assert "Metric: Launches" in p.stderr and "aten::addmm" in p.stderr
    m = json.loads(out.read_text())
    assert m["executed_ops"]["aten::addmm"] >= 12 and m["counters"]["syncs"]["item"] >= 2


@pytest.fixture
def script_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "helper.py").write_text("MSG = 'bad config: lr must be > 0'\n")
    return tmp_path


def test_exit_paths(script_dir, capsys):
    ok = script_dir / "ok.py"
    ok.write_text("import sys, torch, helper\nx = torch.ones(4, device='neuron')\n"
                  "print(sys.argv[1:], (x * 2).sum().item())\n")
    assert run(["--quiet", str(ok), "--lr", "3"]) == 0
    assert "['--lr', '3'] 8.0" in capsys.readouterr().out          # argv and sibling import

    msg = script_dir / "msg.py"
    msg.write_text("import sys, helper\nsys.exit(helper.MSG)\n")
    assert run(["--quiet", str(msg)]) == 1
    assert "bad config: lr must be > 0" in capsys.readouterr().err

    boom = script_dir / "boom.py"
    boom.write_text("import torch\nx = torch.ones(2, device='neuron')\nraise ValueError('boom')\n")
    assert run([str(boom)]) == 1
    err = capsys.readouterr().err
    assert "ValueError: boom" in err and "boom.py\", line 3" in err and "Metric: Ops" in err

    assert run([str(script_dir / "missing.py")]) == 2


def test_progress_line():
    assert progress_line({"compiles_pending": 0}) is None
    line = progress_line({"compiles_pending": 2, "compiles_done": 1, "compiles_failed": 0})
    assert "compiling 2 fused program(s)" in line and "1 ready" in line
