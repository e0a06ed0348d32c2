"""What neuron_lab costs at import: ``python -m neuron_lab.bench.import_time [--runs N]``.

Each figure is the median over ``N`` fresh interpreters, run in turn (interleaved), each with a
new empty ``HOME`` (no cache of any kind carried over) and the environment otherwise unchanged:

- ``import torch`` with autoload off (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``): the baseline;
- ``import torch`` with autoload on (the installed ``torch.backends`` entry point registers
  ``neuron``): the difference is what neuron_lab adds to every ``import torch``;
- ``import neuron_lab`` in a fresh HOME, and the first op on the device after it.

For each: the import's own seconds, timed inside the child around the statement (what a user
waits for), and the whole process's wall and CPU seconds (user + system; interpreter start and
exit included): on a busy machine only the CPU figures carry over.
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
    import_s: float      # the statement itself, timed in the child
    wall_s: float        # the whole process
    cpu_s: float


_TIMED = "import time\n_t0 = time.perf_counter()\n{code}\nprint(time.perf_counter() - _t0)\n"


def _run(autoload: str, code: str) -> Sample:
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, HOME=home, TORCH_DEVICE_BACKEND_AUTOLOAD=autoload)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", _TIMED.format(code=code)], env=env,
                             check=True, capture_output=True, text=True).stdout
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Sample(float(out.split()[-1]), wall, cpu)


def measure(runs: int) -> dict[str, dict[str, float]]:
    samples: dict[str, list[Sample]] = {name: [] for name in CASES}
    _run("1", "import neuron_lab")                  # warm the page cache, not timed
    for _ in range(runs):
        for name, (autoload, code) in CASES.items():
            samples[name].append(_run(autoload, code))
    out = {name: {field: statistics.median(getattr(s, field) for s in ss)
                  for field in Sample._fields}
           for name, ss in samples.items()}
    base, on = out["import torch (autoload off)"], out["import torch (autoload on)"]
    out["autoload adds"] = {field: on[field] - base[field] for field in Sample._fields}
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
        print(f"  {name:32s} import {fig['import_s']:6.2f} s   process: wall "
              f"{fig['wall_s']:6.2f} s, cpu {fig['cpu_s']:6.2f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": args.runs, "load": os.getloadavg()[0], "figures": out}, f,
                      indent=1)


if __name__ == "__main__":
    main()
