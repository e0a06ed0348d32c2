"""``python -m neuron_lab.bench [--budget one-core|all-cores|both] [--quick] [--json FILE]
[--plot FILE.png] [--only W1,W2] [--table FILE.json]``

Runs the workloads (``neuron_lab.bench.WORKLOADS``) on every peer in one process, on one core
budget for all of them (``budget.py``), prints progress on stderr and the markdown table on
stdout, writes the JSON and the plot if asked. ``--budget both`` runs the one-core budget and
then the all-cores one, each in its own child process, and writes one JSON holding both runs.

Cold vs warm: inductor's compiled programs persist under ``NEURON_LAB_CACHE_DIR`` (default
``~/.cache/neuron_lab``), shared by the adaptive runtime and the torch.compile peer. The JSON
records how many cache files existed at start ("warm" if any) and the seconds spent compiling.
``--cold`` re-runs the benchmark in a child process with an empty, temporary cache directory.

``--table FILE.json`` prints the tables of a saved result (``report.py``) and runs nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time


def _cache_state() -> dict:
    d = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
    n = 0
    for _, _, files in os.walk(d) if d else ():
        n += len(files)
        if n > 100_000:
            break
    return {"dir": d, "entries_before": n, "state": "warm" if n else "cold"}


def _machine() -> dict:
    import torch
    import neuron_lab
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        here = os.path.dirname(os.path.abspath(neuron_lab.__file__))
        commit = subprocess.run(["git", "-C", here, "describe", "--always", "--dirty"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    from .budget import allowed
    return {"torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cpu": cpu,
            "cores": len(allowed()), "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads(), "neuron_lab": neuron_lab.__version__,
            "commit": commit, "load_before": round(os.getloadavg()[0], 2),
            "loadavg_before": [round(x, 2) for x in os.getloadavg()],
            "telemetry_listening": _telemetry_listening(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def _telemetry_listening() -> bool:
    from neuron_lab.device import events
    return events.active()


def _cold(argv: list[str]) -> int:
    tmp = tempfile.mkdtemp(prefix="neuron_lab_bench_cache_")
    env = {**os.environ, "NEURON_LAB_CACHE_DIR": tmp, "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor")}
    try:
        return subprocess.call([sys.executable, "-m", "neuron_lab.bench",
                                *[a for a in argv if a != "--cold"]], env=env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _both(argv: list[str], a) -> int:
    """Each budget in its own child process (a pinned process cannot be un-pinned cleanly:
    thread pools keep their size), then one JSON with both runs."""
    from . import report
    runs = []
    with tempfile.TemporaryDirectory(prefix="neuron_lab_bench_") as tmp:
        for name in ("one-core", "all-cores"):
            js = os.path.join(tmp, f"{name}.json")
            rest = _strip(argv, ("--budget", "--json", "--plot"))
            cmd = [sys.executable, "-m", "neuron_lab.bench", *rest, "--budget", name, "--json", js]
            if a.plot:
                root, ext = os.path.splitext(a.plot)
                cmd += ["--plot", f"{root}.{name}{ext or '.png'}"]
            rc = subprocess.call(cmd, stdout=sys.stderr)
            if rc != 0:
                print(f"neuron_lab.bench: the {name} run failed ({rc})", file=sys.stderr)
                return rc
            with open(js) as f:
                runs.append(json.load(f))
    result = report.combine(runs)
    print(report.text(result))
    if a.json:
        report.write_json(result, a.json)
        print(f"wrote {a.json}", file=sys.stderr)
    return 0


def _strip(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """``argv`` without ``flags`` and their values (``--flag v`` or ``--flag=v``)."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in flags:
            skip = True
        elif not any(x.startswith(f + "=") for f in flags):
            out.append(x)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from . import WORKLOADS
    from .peers import ORDER
    ap = argparse.ArgumentParser(prog="python -m neuron_lab.bench", description=__doc__.split("\n\n")[1])
    ap.add_argument("--quick", action="store_true", help="fewer, shorter samples (a few minutes per budget on 2 cores)")
    ap.add_argument("--json", metavar="FILE", help="write every sample, median, ratio and machine info")
    ap.add_argument("--plot", metavar="FILE.png", help="bar chart per workload metric")
    ap.add_argument("--only", metavar="W1,W2", help=f"workloads to run (of {','.join(WORKLOADS)})")
    ap.add_argument("--peers", metavar="P1,P2", help=f"peers to run (of {','.join(ORDER)})")
    ap.add_argument("--distributed", action="store_true",
                    help="also run D1: DDP step time and all-reduce bandwidth with 2 ranks "
                         "(neuron vs gloo on CPU tensors)")
    ap.add_argument("--cold", action="store_true", help="run with an empty temporary inductor cache")
    ap.add_argument("--budget", choices=("one-core", "all-cores", "both"), default="one-core",
                    help="one-core: the process, its threads and helper processes pinned to one "
                         "CPU, one torch thread; all-cores: every allowed CPU, torch threads = "
                         "cores; both: one run of each, one JSON (default: one-core)")
    ap.add_argument("--cpu", type=int, default=None, metavar="K",
                    help="the CPU the one-core budget pins to (default: the first allowed one)")
    ap.add_argument("--optimizer", choices=("foreach", "single-tensor"), default="foreach",
                    help="AdamW's implementation, the same for every peer (default: foreach)")
    ap.add_argument("--table", metavar="FILE.json",
                    help="print the tables of a saved result and exit (runs nothing)")
    a = ap.parse_args(argv)
    if a.table:
        from . import report
        with open(a.table) as f:
            print(report.text(json.load(f)))
        return 0
    if a.cold:
        return _cold(argv)
    if a.budget == "both":
        return _both(argv, a)
    keys = [k.strip().upper() for k in a.only.split(",")] if a.only else list(WORKLOADS)
    bad = [k for k in keys if k not in WORKLOADS]
    if bad:
        ap.error(f"unknown workload(s) {bad}; choose from {', '.join(WORKLOADS)}")

    import torch
    from . import budget, canary, harness, models, modelled, peers, report
    from . import training
    from .micro import copy_bandwidth
    try:
        b = budget.make(a.budget, a.cpu)
    except ValueError as e:
        ap.error(str(e))
    budget.apply(b)             # before any peer starts a thread or a helper process
    models.set_optimizer(a.optimizer)
    torch.manual_seed(0)
    cfg = harness.Config.make(a.quick)
    cache = _cache_state()
    machine = _machine()
    try:
        ps = peers.make([p.strip() for p in a.peers.split(",")] if a.peers else peers.ORDER)
    except ValueError as e:
        ap.error(str(e))
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    canary_start = canary.parallel_op_us()         # before any peer starts a thread
    log(f"neuron_lab.bench: {'quick' if a.quick else 'full'} run, budget {b.name} (CPUs "
        f"{','.join(map(str, b.cpus))}, {b.threads} torch threads), workloads {','.join(keys)}, "
        f"inductor cache {cache['state']} ({cache['dir']})")
    t0 = time.perf_counter()
    result = {"schema": report.SCHEMA, "machine": machine, "cache": cache,
              "budget": b.describe(),
              "config": {"quick": a.quick, "only": keys, "optimizer": a.optimizer,
                         "sync_every": training.SYNC_EVERY, **cfg.__dict__},
              "peers": [p.name for p in ps], "labels": {p.name: p.label for p in ps},
              "workloads": {}}
    for k in keys:
        log(f"{k}: {WORKLOADS[k].title}")
        result["workloads"][k] = harness.run_workload(WORKLOADS[k], ps, cfg, log)
    result["copy_bandwidth_GBps"] = copy_bandwidth(cfg)["GBps"]
    result["parallel_op_us"] = {"start": canary_start, "end": canary.parallel_op_us()}
    warning = canary.check(canary_start, result["parallel_op_us"]["end"])
    if warning:
        log("WARNING: " + warning)
    if a.distributed:
        from . import distributed
        result["distributed"] = distributed.run(a.quick, log)
    result["modelled_trn2"] = modelled.run(keys, log)
    result["seconds"] = time.perf_counter() - t0
    machine["load_after"] = round(os.getloadavg()[0], 2)
    print(report.text(result))
    if result["modelled_trn2"]:
        print("\n" + modelled.table(result["modelled_trn2"]))
    if "distributed" in result:
        from . import distributed
        print("\n" + distributed.table(result["distributed"]))
    if a.json:
        report.write_json(result, a.json)
        log(f"wrote {a.json}")
    if a.plot:
        report.plot(result, a.plot)
        log(f"wrote {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
