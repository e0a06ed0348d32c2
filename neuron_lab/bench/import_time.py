"""What neuron_lab costs at import: ``python -m neuron_lab.bench.import_time [--runs N]``.

Each figure is the median over ``N`` fresh interpreters, run in turn (interleaved), each with a
new empty ``HOME`` (no cache of any kind carried over) and the environment otherwise unchanged:

- ``import torch`` with autoload off (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``): the baseline;
- ``import torch`` with autoload on (the installed ``torch.backends`` entry point registers
  ``neuron``): the difference is what neuron_lab adds to every ``import torch``;
- ``import neuron_lab`` in a fresh HOME, and the first op on the device after it.

Wall seconds and CPU seconds (user + system, the child's own) are both printed: on a busy machine
only the CPU figures carry over.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

CASES = {
    "import torch (autoload off)": ("0", "import torch"),
    "import torch (autoload on)": ("1", "import torch"),
    "import neuron_lab": ("1", "import neuron_lab"),
    "import neuron_lab + first op": ("1", "import neuron_lab, torch; "
                                          "(torch.ones(4, device='neuron') * 2).sum().item()"),
}


class Sample(NamedTuple):
    wall_s: float
    cpu_s: float


def _run(autoload: str, code: str) -> Sample:
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, HOME=home, TORCH_DEVICE_BACKEND_AUTOLOAD=autoload)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Sample(wall, cpu)


def measure(runs: int) -> dict[str, dict[str, float]]:
    samples: dict[str, list[Sample]] = {name: [] for name in CASES}
    _run("1", "import neuron_lab")                  # warm the page cache, not timed
    for _ in range(runs):
        for name, (autoload, code) in CASES.items():
            samples[name].append(_run(autoload, code))
    out = {name: {"wall_s": statistics.median(s.wall_s for s in ss),
                  "cpu_s": statistics.median(s.cpu_s for s in ss)}
           for name, ss in samples.items()}
    base, on = out["import torch (autoload off)"], out["import torch (autoload on)"]
    out["autoload adds"] = {"wall_s": on["wall_s"] - base["wall_s"],
                            "cpu_s": on["cpu_s"] - base["cpu_s"]}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    out = measure(args.runs)
    print(f"medians of {args.runs} fresh interpreters, load {os.getloadavg()[0]:.2f}, "
          f"{os.cpu_count()} CPUs")
    for name, fig in out.items():
        print(f"  {name:32s} wall {fig['wall_s']:6.2f} s   cpu {fig['cpu_s']:6.2f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": args.runs, "load": os.getloadavg()[0], "figures": out}, f,
                      indent=1)


if __name__ == "__main__":
    main()
