"""Threads in adaptive mode: each thread's results equal its eager results.

Stress: several threads run the same 5-op chain on their own data while the interpreter
switches threads every microsecond, so their ops interleave at every possible point of the
engine (capture, deferral, divergence, launch, materialize). Before the engine lock, this
raised IndexError/shape errors from another thread's records and, worse, passed one thread
another thread's output.
"""
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import neuron_lab
from neuron_lab import runtime
from neuron_lab.runtime import knobs, programs


def _chain(x, w):
    y = x * 1.5
    y = torch.tanh(y)
    y = y @ w
    y = y - x
    return y.sum(dim=1)


def _run_threads(n_threads, iters, fn, switch_s=1e-6):
    errors, results = [], {}
    start = threading.Barrier(n_threads)

    def body(i):
        try:
            start.wait()
            results[i] = fn(i, iters)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append((i, e))

    old = sys.getswitchinterval()
    sys.setswitchinterval(switch_s)
    try:
        ts = [threading.Thread(target=body, args=(i,)) for i in range(n_threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert not any(t.is_alive() for t in ts), "a thread hung"
    finally:
        sys.setswitchinterval(old)
    return errors, results


def _inputs(i):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(7, 5, generator=g), torch.randn(5, 5, generator=g)


@pytest.mark.parametrize("sync_each", [True, False], ids=["item-each-iter", "deferred-loop"])
def test_threads_get_their_own_results(compile_off, sync_each):
    n_threads, iters = 4, 400
    expect = {i: _chain(*_inputs(i)) for i in range(n_threads)}

    def work(i, iters):
        x, w = (t.to("neuron") for t in _inputs(i))
        outs = []
        for _ in range(iters):
            y = _chain(x, w)
            if sync_each:
                y.sum().item()
            outs.append(y)
        return [o.cpu() for o in outs]

    errors, results = _run_threads(n_threads, iters, work)
    assert not errors, errors[:3]
    for i in range(n_threads):
        for got in results[i]:
            torch.testing.assert_close(got, expect[i], rtol=0, atol=0)
    assert all(r["status"] != "failed" for r in runtime.regions())


def test_threads_with_fused_programs(fresh_engine):
    """Same, with regions compiled (foreground) and launched fused while threads interleave.
    The region is learned and compiled first, on one thread (every thread's chain has the
    same keys), and the threads switch every 200 us: an iteration (~100 us) runs whole often
    enough to launch the program, and many are cut by another thread's ops. (At a 1 us switch
    interval, as above, whether any iteration runs whole depends on the machine's load.)"""
    n_threads, iters = 3, 30
    expect = {i: _chain(*_inputs(i)) for i in range(n_threads)}

    def work(i, iters):
        x, w = (t.to("neuron") for t in _inputs(i))
        outs = []
        for _ in range(iters):
            y = _chain(x, w)
            y.sum().item()
            outs.append(y.cpu())
        return outs

    with knobs.TRIALS.scoped(0):
        work(0, 6)
        fused = runtime.stats()["launches_fused"]
        assert fused > 0
        errors, results = _run_threads(n_threads, iters, work, switch_s=2e-4)
    assert not errors, errors[:3]
    for i in range(n_threads):
        for got in results[i]:
            torch.testing.assert_close(got, expect[i], rtol=1e-5, atol=1e-5)
    assert runtime.stats()["launches_fused"] > fused


_EXACT_AFTER_THREADS = """
import gc, json, sys
sys.path.insert(0, sys.argv[1])
import torch
import neuron_lab
from neuron_lab.device import memory, runtime_interface
from neuron_lab.runtime import knobs, programs
from test_threads import _run_threads


def work(i, iters):
    x = torch.randn(32, 32).to("neuron")
    for _ in range(iters):
        y = (x * 2 + 1).relu()
        del y
    del x
    neuron_lab.sync()


report = {}
with knobs.COMPILE.scoped(False):
    neuron_lab.sync()
    gc.collect()
    report["base"] = (memory.counted(), runtime_interface.pending_bytes())
    for mode in ("eager", "adaptive"):
        with neuron_lab.mode(mode):
            errors, _ = _run_threads(4, 300, work)
            report[mode + "_errors"] = [repr(e) for e in errors[:3]]
            neuron_lab.sync()
        gc.collect()                 # cyclic garbage is freed by the collector, not counted
        report[mode] = (memory.counted(), runtime_interface.pending_bytes())
print("REPORT " + json.dumps(report))
"""


def test_memory_accounting_exact_after_threads():
    """Threads allocate and free concurrently (the uncount runs in whichever thread frees the
    storage): afterwards memory_allocated() is back where it started, in eager and adaptive
    mode. In a process of its own: the check is exact to the byte, and in the suite's worker a
    storage an earlier test left behind can die while the threads run (it did: 304 B)."""
    p = subprocess.run([sys.executable, "-c", _EXACT_AFTER_THREADS, str(Path(__file__).parent)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("REPORT ")]
    assert line, p.stdout[-2000:] + p.stderr[-2000:]
    r = json.loads(line[0][len("REPORT "):])
    for mode in ("eager", "adaptive"):
        assert not r[mode + "_errors"], r[mode + "_errors"]
        assert r[mode] == r["base"], ("(counted, pending) at the base and after", mode, r)


def test_fx_annotations_of_the_users_thread_survive_a_region_compile_beside_it():
    """``torch.fx.traceback.annotate`` on the user's thread while a thread compiling a region
    enters and leaves ``preserve_node_meta``, as inductor's ``compile_fx`` does around every
    compile and cache load: the annotation stays until its own exit deletes it. Without
    ``programs._fx_meta_stays_in_its_thread`` the compile's exit rebinds ``current_meta`` to its
    copy from before the annotation, and that delete raises KeyError (seen in CI from
    ``create_block_mask``, which annotates, beside a background load)."""
    from torch.fx import traceback as fx_traceback
    programs._fx_meta_stays_in_its_thread()
    entered, annotated, left = threading.Event(), threading.Event(), threading.Event()
    flags = []

    def compiling():
        with programs._compiling_region(), fx_traceback.preserve_node_meta():
            flags.append(fx_traceback.should_preserve_node_meta)
            entered.set()
            annotated.wait(10)
        left.set()

    t = threading.Thread(target=compiling)
    t.start()
    assert entered.wait(10)
    with fx_traceback.annotate({"user": 1}):
        annotated.set()
        assert left.wait(10)
        assert fx_traceback.current_meta["custom"] == {"user": 1}
    t.join(10)
    assert "custom" not in fx_traceback.current_meta
    assert flags == [True] and fx_traceback.should_preserve_node_meta is False
