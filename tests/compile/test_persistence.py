"""Compiled programs persist with the adaptive runtime's cache (NEURON_LAB_CACHE_DIR): a second
process compiling the same graph on neuron loads inductor's program instead of generating it."""
import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, torch, neuron_lab
from torch._dynamo.utils import counters
f = torch.compile(lambda a, b: (a @ b).relu().sum(dim=0), backend="neuron")
a, b = torch.randn(16, 8), torch.randn(8, 4)
out = f(a.to("neuron"), b.to("neuron"))
assert torch.allclose(out.cpu(), (a @ b).relu().sum(dim=0), rtol=1e-5, atol=1e-6)
print(json.dumps({"hit": counters["inductor"]["fxgraph_cache_hit"],
                  "miss": counters["inductor"]["fxgraph_cache_miss"],
                  "programs": neuron_lab.compile.outcomes.snapshot()["programs"]}))
"""


def _run(cache_dir) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env.update(NEURON_LAB_CACHE_DIR=str(cache_dir), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_restarted_process_reloads_compiled_programs(tmp_path):
    cold = _run(tmp_path)
    assert cold["miss"] >= 1 and cold["hit"] == 0 and cold["programs"] == 1
    assert (tmp_path / "inductor").is_dir()
    warm = _run(tmp_path)
    assert warm["hit"] >= 1 and warm["miss"] == 0 and warm["programs"] == 1
