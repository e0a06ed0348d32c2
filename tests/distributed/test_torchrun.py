"""``torchrun --nproc-per-node 2 examples/train_ddp.py`` as a user runs it (real torchrun, real
processes on loopback): DDP on neuron ends with the parameters of one CPU process on the full
batches, in both modes; under ``python -m neuron_lab run`` each rank writes its own report."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_ddp.py")


def _torchrun(*args, mode: str, cwd) -> str:
    env = dict(os.environ, NEURON_LAB_MODE=mode, PYTHONPATH=ROOT + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--rdzv-endpoint", "127.0.0.1:0", "--rdzv-backend", "c10d", *args]
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout + p.stderr


def _check(out: str, mode: str) -> None:
    ranks = re.findall(r"rank (\d)/2: last loss [\d.]+, mean over ranks ([\d.]+) "
                       r"\(backend neuron:neuron, mode (\w+)\)", out)
    assert sorted(r for r, _, _ in ranks) == ["0", "1"], out[-2000:]
    assert {m for _, _, m in ranks} == {mode}
    assert len({mean for _, mean, _ in ranks}) == 1          # both ranks agree on the mean
    diff = float(re.search(r"max \|parameter difference\| .*: ([\d.e+-]+)", out).group(1))
    assert diff < 1e-5


def test_train_ddp_example_under_torchrun_eager(tmp_path):
    _check(_torchrun(EXAMPLE, "--check", mode="eager", cwd=tmp_path), "eager")


def test_neuron_lab_run_under_torchrun_reports_per_rank(tmp_path):
    out = _torchrun("-m", "neuron_lab", "run", "--json", "m.json", EXAMPLE, "--check",
                    mode="adaptive", cwd=tmp_path)
    _check(out, "adaptive")
    assert out.count("Metric: Distributed") == 2
    for rank in (0, 1):
        m = json.loads((tmp_path / f"m.rank{rank}.json").read_text())
        d = m["distributed"]
        assert (d["rank"], d["world_size"]) == (rank, 2)
        assert d["ops"]["all_reduce"] >= 24 and d["collective_bytes"] > 0
        assert m["memory"]["capacity"] > 0 and m["memory"]["peak"] > 0
