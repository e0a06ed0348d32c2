"""Interpreter exit with compiles queued: queued compiles are dropped, a running one is given
``NEURON_LAB_EXIT_WAIT_S`` and then cancelled, nothing is compiled after the script's last line.

Before: the worker ran every queued compile at exit (each failing with "can't register atexit
after shutdown"); a script that formed ~150 regions took 94 s to exit.
"""
import json
import os
import subprocess
import sys
import textwrap

import torch

from neuron_lab import runtime
from neuron_lab.runtime import knobs, worker

SCRIPT = textwrap.dedent("""
    import atexit, json, sys, time
    report = {}

    def last():                       # registered first: runs after neuron_lab's handlers
        from neuron_lab.runtime import worker
        report["exit_s"] = time.perf_counter() - report["t_last_line"]
        report.update(worker.state)
        print("REPORT " + json.dumps(report), flush=True)

    atexit.register(last)
    import torch, neuron_lab
    from neuron_lab.runtime import worker
    for n in range(20, 32):           # 12 distinct regions, each hot enough to compile
        x = torch.randn(n, device="neuron")
        for _ in range(3):
            y = x
            for _ in range(5):
                y = torch.sin(y) * 1.5 + 0.25
            y.sum().item()
    report["queued_at_last_line"] = worker.pending()
    report["t_last_line"] = time.perf_counter()
""")


def test_exit_drops_queued_compiles(tmp_path):
    env = dict(os.environ, NEURON_LAB_CACHE_DIR=str(tmp_path / "cache"),   # cold: compiles are slow
               NEURON_LAB_COMPILE_QUEUE="4", NEURON_LAB_EXIT_WAIT_S="0.5",
               TORCHINDUCTOR_COMPILE_THREADS="1")
    env.pop("NEURON_LAB_SYNC_COMPILE", None)
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("REPORT ")]
    assert line, p.stdout[-2000:] + p.stderr[-2000:]
    r = json.loads(line[0][7:])
    assert 2 <= r["queued_at_last_line"] <= 4          # bounded by NEURON_LAB_COMPILE_QUEUE
    assert r["queued"] == 0 and r["running"] == 0
    # every compile queued at the last line was dropped or cancelled, at most one finished
    assert r["dropped"] + r["cancelled"] >= r["queued_at_last_line"] - 1
    assert "can't register atexit" not in p.stderr
    print(f"exit took {r['exit_s']:.2f} s with {r['queued_at_last_line']} compiles queued")


def test_evicted_region_is_dropped_from_the_queue(fresh_engine, monkeypatch):
    import threading
    compiled, started, release = [], threading.Event(), threading.Event()

    def fake_compile(region, *a):       # the first compile blocks: later ones wait in the queue
        started.set()
        release.wait(60)
        compiled.append(region.id)

    monkeypatch.setattr(worker, "_compile", fake_compile)
    dropped = worker.state["dropped"]
    with knobs.SYNC_COMPILE.scoped(False), knobs.CACHE_SIZE.scoped(2):
        try:
            for n in range(3, 7):       # 4 regions through a cache of 2: the first two evicted
                x = torch.ones(n).to("neuron")     # a transfer: not a region of its own
                for _ in range(3):
                    (x * 2 + 1).sin().cos().sum().item()
                if n == 3:              # the worker holds the first region before the next come
                    assert started.wait(30)
            live = {r["id"] for r in runtime.regions()}
        finally:
            release.set()
        assert runtime.wait_compiles(timeout=60)
    first, *rest = compiled              # the one that was running when evicted
    assert set(rest) <= live and len(rest) == 2
    assert worker.state["dropped"] - dropped == 1


def test_a_finished_compile_leaves_nothing_on_the_worker(fresh_engine):
    """When ``wait_compiles`` returns, the worker thread has let go of the region it compiled,
    its graph and its example inputs: a region the cache forgot dies with it. (The worker kept
    its last job until the next one came, and ``wait`` returned before the compile's frame
    ended.)"""
    import gc
    import weakref
    with knobs.SYNC_COMPILE.scoped(False), knobs.COMPILE_HELPER.scoped(False), \
            knobs.COMPILE_AFTER.scoped(1):
        x = torch.randn(16, 16).to("neuron")
        for _ in range(4):
            (x * 2 + 1).relu().sum().item()
        assert runtime.wait_compiles(timeout=120)
    compiled = [weakref.ref(r) for r in runtime.current().engine.cache.lru.values()
                if r.compile_s is not None]
    assert compiled
    runtime.reset()
    gc.collect()
    assert all(r() is None for r in compiled)
