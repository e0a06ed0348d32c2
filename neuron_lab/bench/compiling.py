"""W7: what a user's loop pays while the adaptive runtime compiles in the background.

The W3 step (MLP + AdamW) in a fresh Python process with an **empty** inductor cache (a new
temporary ``NEURON_LAB_CACHE_DIR``), on the run's core budget (the child inherits the affinity
mask; ``NEURON_LAB_BENCH_THREADS`` gives its torch threads), as a notebook user meets it the
first time: first 30 steps in eager mode (the reference: per-op launches, nothing compiles), then
steps in adaptive mode on the same model, each timed on its own (ending at ``.item()``), until
every region the runtime queued has compiled (``runtime.stats()["compiles_pending"] == 0``,
at most ``BUDGET_S``), then 30 eager steps again: the reference is the median of the 60, so a
machine that is faster or slower during one of the phases (they are tens of seconds apart)
weighs on both sides of the ratio. A step "overlaps a compile" when a compile was running at
its start or its end (``worker.state["running"]``).

Reported (adaptive peer only): ``slowdown`` = the time the steps that overlap a compile took /
(their number x the median eager step): the mean, so the slow steps count (their median is
near 1: most of a compile runs in the helper process and the C++ compiler, and per-op replay
costs about what eager does); the target is <= 1.2x. ``worst_ms``: the slowest such step
(typically the first program loaded in the process, when inductor sets itself up);
``compile_s``: the wall time from the first adaptive step until the compiles were done. The
child writes one JSON line; the samples of every step are in the JSON report's ``extra``.

Each metric has one sample per child, and ``RUNS`` (3; 1 with ``--quick``) children run one
after another; the report gives their median, as for every other workload: one child is one
cold compile, a single measurement on a machine whose load moves.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from .harness import Metric, Ratio, Skip, Workload

EAGER_STEPS, BUDGET_S, RUNS = 30, 240.0, 3


def _child(budget_s: float) -> dict:
    import torch

    import neuron_lab
    from neuron_lab import runtime
    from neuron_lab.runtime import worker

    from . import models

    class _Peer:                  # models.make's view of a peer: the device and the module
        device = "neuron"

        @staticmethod
        def module(m):
            return m

    torch.set_num_threads(int(os.environ.get("NEURON_LAB_BENCH_THREADS", "1")))  # the budget's
    neuron_lab.set_mode("eager")
    model, opt, (x, y) = models.make("mlp", _Peer)

    def step() -> float:
        t0 = time.perf_counter()
        models.train_step(model, opt, x, y).item()
        return time.perf_counter() - t0

    for _ in range(10):
        step()
    eager = [step() for _ in range(EAGER_STEPS)]
    neuron_lab.set_mode("adaptive")
    steps, overlap = [], []
    t_start = time.perf_counter()
    while time.perf_counter() - t_start < budget_s:
        before = worker.state["running"] > 0
        dt = step()
        steps.append(dt)
        overlap.append(before or worker.state["running"] > 0)
        st = runtime.stats()
        if st["compiles_queued"] and not st["compiles_pending"] and len(steps) > 20:
            break
    wall = time.perf_counter() - t_start
    st = runtime.stats()
    neuron_lab.set_mode("eager")          # the reference again, after the compiles
    for _ in range(5):
        step()
    eager_after = [step() for _ in range(EAGER_STEPS)]
    return {"eager_s": eager, "eager_after_s": eager_after, "adaptive_s": steps,
            "overlap": overlap, "wall_s": wall, "compiles": st["compiles_done"],
            "compiles_failed": st["compiles_failed"], "pending": st["compiles_pending"]}


def _one_child(budget: float) -> dict:
    """One cold compile in a fresh process: its slowdown, worst step, compile wall time and the
    per-step record (``extra``)."""
    with tempfile.TemporaryDirectory(prefix="neuron_lab_w7_") as tmp:
        env = dict(os.environ, NEURON_LAB_CACHE_DIR=tmp,
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"))
        code = f"import json, neuron_lab.bench.compiling as c; print(json.dumps(c._child({budget})))"
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=budget + 180)
    if p.returncode != 0:
        raise RuntimeError(f"W7 child failed ({p.returncode}): {p.stderr[-600:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    during = [t for t, o in zip(r["adaptive_s"], r["overlap"]) if o]
    if not during:
        raise Skip(f"no step overlapped a compile ({r['compiles']} compiles, "
                   f"{r['compiles_failed']} failed)")
    eager = statistics.median(r["eager_s"] + r["eager_after_s"])
    return {"slowdown": sum(during) / (len(during) * eager),
            "worst_ms": max(during) * 1e3,
            "compile_s": r["wall_s"],
            "extra": {"eager_step_ms": eager * 1e3,
                      "eager_before_ms": statistics.median(r["eager_s"]) * 1e3,
                      "eager_after_ms": statistics.median(r["eager_after_s"]) * 1e3,
                      "steps_overlapping": len(during),
                      "median_slowdown": statistics.median(during) / eager,
                      "steps": len(r["adaptive_s"]), "compiles": r["compiles"],
                      "compiles_failed": r["compiles_failed"], "still_pending": r["pending"],
                      "adaptive_step_ms": [t * 1e3 for t in r["adaptive_s"]],
                      "overlap": r["overlap"]}}


def run_w7(peer, cfg) -> dict:
    if peer.name != "neuron_adaptive":
        raise Skip("not applicable: measures the adaptive runtime's background compiles")
    runs = [_one_child(60.0 if cfg.quick else BUDGET_S) for _ in range(1 if cfg.quick else RUNS)]
    out: dict = {m: [r[m] for r in runs] for m in ("slowdown", "worst_ms", "compile_s")}
    out["extra"] = {"runs": [r["extra"] for r in runs]}
    return out


W7 = Workload(
    "W7", "slowdown while compiling: W3's step from an empty inductor cache, vs eager",
    [Metric("slowdown", "× eager step", "lower"), Metric("worst_ms", "ms", "lower", log=True),
     Metric("compile_s", "s", "lower")],
    run_w7,
    [Ratio("W7 step time while compiling / eager step time", ("slowdown", "neuron_adaptive"), None,
           "<=", 1.2)],
    peers=("neuron_adaptive",))
