"""The compile helper (runtime/helper.py): background compiles run in a second process and the
user's process loads the program from inductor's caches; without a helper, or after its error,
the region compiles in the user's process as before."""
import io
import os
import pickle

import pytest
import torch
from torch._dynamo.utils import counters

from neuron_lab import runtime
from neuron_lab.runtime import helper, knobs, programs, worker
from neuron_lab.runtime.status import Status


@pytest.fixture
def background(tmp_path):
    """Background compiles with the helper on (the runtime's default outside the tests), and
    no marker of an earlier helper compile (they live in the cache directory; inductor's own
    caches stay where they are, set once per process)."""
    helper.state["broken"] = None
    with knobs.SYNC_COMPILE.scoped(False), knobs.COMPILE_HELPER.scoped(True), \
            knobs.TRIALS.scoped(0), knobs.CACHE_DIR.scoped(str(tmp_path)):
        yield
    runtime.wait_compiles()


@pytest.fixture
def graphs(monkeypatch):
    """The graphs the policy submits for compiling."""
    got = []
    real = worker.submit

    def submit(region, graph, examples, *a, **k):
        got.append((torch.fx.GraphModule(torch.nn.Module(), graph), examples))
        return real(region, graph, examples, *a, **k)
    monkeypatch.setattr(worker, "submit", submit)
    return got


def _mlp_step(model, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss


def _train(dev, steps):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).to(dev)
    x, y = torch.randn(8, 16).to(dev), torch.randint(0, 4, (8,)).to(dev)
    losses = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        losses.append(_mlp_step(model, x, y).item())
        if dev == "neuron":
            runtime.wait_compiles()
    return losses, [p.grad.cpu() for p in model.parameters()]


def test_graph_spec_rebuilds_the_same_code(graphs):
    """A real region's graph (lists of nodes, getitem, device and memory-format arguments)
    survives pickling as node specs with the same code: the same inductor cache keys."""
    with knobs.COMPILE.scoped(True):
        _train("neuron", 3)
    assert graphs
    for gm, examples in graphs:
        spec = pickle.loads(pickle.dumps(helper.graph_spec(gm)))
        assert helper.graph_of(spec).code == gm.code
        for t in examples:
            e = helper.example_of(pickle.loads(pickle.dumps(helper.example_spec(t))))
            assert (e.shape, e.stride(), e.dtype) == (t.shape, t.stride(), t.dtype)


def test_examples_are_layouts_on_storages_of_their_own(graphs):
    """``compiler.build``'s examples carry each input's layout on a storage of its own and no
    values (the compile fakes them; of their values only the packed floats are read): no copy
    of the model's parameters per compile, and no views (a fake of a view fakes its base first
    and replays the view, ~1.2 ms an input of a program load, the GIL held)."""
    from neuron_lab.device import tensor_data
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(16, 8).to("neuron")
    with knobs.COMPILE.scoped(True):
        for _ in range(4):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    hosts = [tensor_data.host(p) for p in model.parameters()]
    assert graphs
    for gm, examples in graphs:
        for t in examples:
            assert t._base is None
            assert all(t.untyped_storage().data_ptr() != h.untyped_storage().data_ptr()
                       for h in hosts)
    shapes = {(tuple(t.shape), t.stride()) for _, ex in graphs for t in ex}
    assert all((tuple(h.shape), h.stride()) in shapes for h in hosts)


def test_regions_compile_in_the_helper_and_load_from_the_cache(background):
    compiles = helper.state["compiles"]
    hits = counters["aot_autograd"]["autograd_cache_hit"]
    want = _train("cpu", 5)
    got = _train("neuron", 5)
    assert helper.running() and helper.state["broken"] is None
    assert helper.state["compiles"] > compiles
    # each program the helper compiled, the user's process loaded from the cache
    assert counters["aot_autograd"]["autograd_cache_hit"] - hits >= helper.state["compiles"] - compiles
    assert any(r["status"] == "fused" and r["fused_launches"] for r in runtime.regions())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_a_graph_compiled_by_a_helper_before_is_not_sent_again(background):
    _train("neuron", 5)
    compiles, known = helper.state["compiles"], helper.state["known"]
    assert compiles
    runtime.reset()                 # the same graphs again: their programs are in the caches
    _train("neuron", 5)
    assert helper.state["compiles"] == compiles and helper.state["known"] > known
    assert any(r["status"] == "fused" and r["fused_launches"] for r in runtime.regions())


def test_without_a_helper_regions_compile_here(background, monkeypatch):
    helper.stop()
    monkeypatch.setattr(helper, "_MAIN", "import sys; sys.exit(3)")   # starts, then dies
    want = _train("cpu", 5)
    got = _train("neuron", 5)
    assert helper.state["broken"] is not None and not helper.running()
    assert any(r["status"] == "fused" and r["fused_launches"] for r in runtime.regions())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    helper.state["broken"] = None


def test_a_helper_error_compiles_here(background, monkeypatch):
    asked = []

    def failing(*a):
        asked.append(1)
        return helper.Reply(False, None, "RuntimeError: only in the helper", 0.0)
    monkeypatch.setattr(helper, "ask", failing)
    _train("neuron", 5)
    assert asked
    assert all(r["status"] != str(Status.FAILED) for r in runtime.regions())
    assert any(r["status"] == "fused" and r["fused_launches"] for r in runtime.regions())


def test_a_compile_past_its_time_limit_fails_and_the_next_starts_a_new_helper(background):
    """Past ``NEURON_LAB_COMPILE_TIMEOUT_S`` the helper is killed and the region fails (stays
    per-op, results unchanged), without a compile in this process; a later compile starts a new
    helper. (0.05 s: shorter than the helper's start-up, so every compile here runs past it.)"""
    helper.stop()
    timeouts, started = helper.state["timeouts"], helper.state["started"]
    want = _train("cpu", 5)
    with knobs.COMPILE_TIMEOUT_S.scoped(0.05):
        got = _train("neuron", 5)
    assert helper.state["timeouts"] > timeouts and not helper.running()
    assert helper.state["broken"] is None
    failed = [r for r in runtime.regions() if r["status"] == str(Status.FAILED)]
    assert failed and all("CompileTimeout" in r["error"] and "NEURON_LAB_COMPILE_TIMEOUT_S"
                          in r["error"] for r in failed)
    assert not any(r["fused_launches"] for r in runtime.regions())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    runtime.reset()
    got = _train("neuron", 5)
    assert helper.running() and helper.state["started"] > started + 1
    assert any(r["status"] == "fused" and r["fused_launches"] for r in runtime.regions())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_the_helper_replies_with_its_error():
    """The helper's loop, in this process: a graph inductor cannot compile gets ok=False and the
    error, and the loop goes on to the next request."""
    g = torch.fx.Graph()
    a = g.placeholder("in0")
    g.output((g.call_function(torch.ops.aten.mm.default, (a, a)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    build = programs.Build()
    bad = helper.Request(helper.graph_spec(gm), [helper.example_spec(torch.randn(3))], build,
                         None, None)                   # mm of a 1-d tensor: fails to trace
    good = helper.Request(helper.graph_spec(gm), [helper.example_spec(torch.randn(3, 3))],
                          build, None, None)
    inp, out = io.BytesIO(), io.BytesIO()
    for r in (bad, good):
        pickle.dump(r, inp)
    inp.seek(0)
    helper._serve(inp, out)
    out.seek(0)
    r1, r2 = pickle.load(out), pickle.load(out)
    assert not r1.ok and r1.error
    assert r2.ok and r2.error is None


def test_the_helper_runs_below_the_users_priority(background):
    """Where the helper and the user's loop share a core, the loop keeps most of it."""
    from neuron_lab.runtime import knobs
    helper.stop()
    with knobs.COMPILE_NICE.scoped(7):
        _train("neuron", 4)
        assert helper.running()
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, helper._proc.pid) == min(own + 7, 19)
        # in a session of its own, Linux schedules the helper's group apart from the user's:
        # the group is niced too, or the process's nice does nothing against the user's loop
        group = f"/proc/{helper._proc.pid}/autogroup"
        if os.path.exists(group):
            with open(group) as f:
                assert f.read().split()[-1] == "7"
    helper.stop()


@pytest.mark.parametrize("nice,policy", [(5, "SCHED_OTHER"), (19, "SCHED_IDLE")])
def test_the_helper_starts_below_the_users_priority(background, nice, policy):
    """The helper is lowered from its start, not after its imports (seconds of CPU a user's loop
    would share the core with at full priority): when the helper has just been started, its
    priority is already down (its Python is still starting, far from importing torch). At the
    lowest priority (19, the default) it runs under SCHED_IDLE."""
    from neuron_lab.runtime import knobs
    helper.stop()
    with knobs.COMPILE_NICE.scoped(nice):
        try:
            proc = helper._started()
            assert proc is not None
            own = os.getpriority(os.PRIO_PROCESS, 0)
            assert os.getpriority(os.PRIO_PROCESS, proc.pid) == min(own + nice, 19)
            if hasattr(os, "sched_getscheduler"):
                assert os.sched_getscheduler(proc.pid) == getattr(os, policy)
            group = f"/proc/{proc.pid}/autogroup"
            if os.path.exists(group):
                with open(group) as f:
                    assert f.read().split()[-1] == str(nice)
        finally:
            helper.stop()


def test_ctrl_c_leaves_the_helper_running(background):
    """A terminal's Ctrl-C goes to its whole process group, and Jupyter's interrupt may: the
    helper is in a session of its own and ignores SIGINT, so the user's interrupt does not
    cost the process its compiles."""
    import signal
    import time
    _train("neuron", 4)
    assert helper.running()
    pid = helper._proc.pid
    assert os.getsid(pid) != os.getsid(0)
    os.kill(pid, signal.SIGINT)
    time.sleep(0.5)
    assert helper.running() and helper._proc.pid == pid
    compiles = helper.state["compiles"]
    k = 1.0 + (os.getpid() % 9973) / 1e5    # a constant this process alone compiles in
    x = torch.randn(8, 24).to("neuron")
    for _ in range(4):
        ((x * k).sin() @ x.T).relu().sum().item()
        runtime.wait_compiles()
    assert helper.state["broken"] is None and helper.state["compiles"] > compiles


def test_stop_ends_the_helper(background):
    _train("neuron", 4)
    assert helper.running()
    helper.stop()
    assert not helper.running()


def test_floats_that_cannot_be_data_are_specialized_once(background, monkeypatch):
    """``lerp``'s weight cannot be data: the helper tries the packed floats, fails, specializes;
    the user's process is told so and compiles the specialized program only (a cache hit),
    never the packed attempt."""
    tried = []
    real = programs._inductor

    def spy(gm, examples, build):
        tried.append(any(n.target is torch.ops.aten._local_scalar_dense.default
                         for n in gm.graph.nodes))
        return real(gm, examples, build)
    monkeypatch.setattr(programs, "_inductor", spy)
    compiles = helper.state["compiles"]
    a, b = torch.randn(64), torch.randn(64)
    na, nb = a.to("neuron"), b.to("neuron")
    for i in range(6):                       # a different weight each launch: not constant
        r = (torch.lerp(na, nb, 0.1 * (i + 1)).sin() * 2 + 1)
        r.sum().item()
        runtime.wait_compiles()
    assert helper.state["compiles"] > compiles
    (reg,) = [r for r in runtime.current().engine.cache.regions() if r.program is not None]
    assert isinstance(reg.program, programs.Specialized) and not reg.program.chosen
    assert tried == [False]                  # here: only the specialized graph (no item())


def test_floats_the_helper_compiled_as_data_load_without_a_copy(background, graphs,
                                                                 monkeypatch):
    """Floats that changed every launch are data; once the helper compiled them so, the user's
    process loads the same packed program (a cache hit) from the graph itself, keeping no copy
    of it for a specialized fallback it will not need."""
    given = []
    real = programs._inductor
    monkeypatch.setattr(programs, "_inductor", lambda gm, *a: given.append(gm) or real(gm, *a))
    compiles = helper.state["compiles"]
    a = torch.randn(64).to("neuron")
    for i in range(6):                       # a different factor each launch: not constant
        (a * (0.1 * (i + 1))).sin().add(1).sum().item()
        runtime.wait_compiles()
    assert helper.state["compiles"] > compiles
    (reg,) = [r for r in runtime.current().engine.cache.regions() if r.program is not None]
    assert not isinstance(reg.program, programs.Specialized)
    assert given and all(any(g.graph is gm.graph for gm, _ in graphs) for g in given)


def _session_child(code: str):
    import subprocess
    import sys
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            start_new_session=True)


@pytest.mark.parametrize("code,answered", [
    # ~0.75 s of CPU over ~3 s of wall time, then a reply
    ("import time\nfor _ in range(6):\n    time.sleep(0.4)\n    t = time.process_time()\n"
     "    while time.process_time() - t < 0.12: pass\nprint('done', flush=True)", True),
    ("while True: pass", False),                       # spins past the limit
    ("import time\ntime.sleep(60)", False),           # no CPU for as long as the limit: stuck
])
def test_the_compile_limit_is_cpu_time(code, answered):
    """A compile's limit counts the helper's CPU seconds, not wall time (at the lowest priority a
    busy loop leaves the helper little CPU, so its wall time has no bound); a helper that uses
    no CPU for as long as the limit counts as stuck."""
    import time
    proc = _session_child(code)
    try:
        t0 = time.monotonic()
        assert helper._answered(proc, 1.0) is answered
        if answered:
            assert time.monotonic() - t0 > 1.0 and proc.stdout.readline() == b"done\n"
    finally:
        proc.kill()
        proc.wait()


def test_a_forked_child_leaves_its_parents_helper_alone(background, monkeypatch):
    """A child forked after the helper started inherits its pipes: it neither stops the
    parent's helper nor sends it requests (it would interleave with the parent's)."""
    _train("neuron", 4)
    parent = helper._proc
    assert parent is not None and helper.running()
    monkeypatch.setattr(helper.os, "getpid", lambda: helper._owner + 1)   # as in the child
    helper.stop()
    assert parent.poll() is None                       # still the parent's, running
    helper._proc = parent
    own = type("Started", (), {"pid": None})()
    monkeypatch.setattr(helper.subprocess, "Popen", lambda *a, **k: own)
    monkeypatch.setattr(helper.process_cpu, "lower_priority", lambda pid, nice: None)
    assert helper._started() is own
    monkeypatch.undo()
    helper._proc, helper._owner = parent, os.getpid()   # back in the parent
    helper.stop()
    assert parent.poll() is not None


def test_programs_are_written_for_the_users_thread_count(monkeypatch):
    """Inductor writes the OpenMP thread count into a CPU program's code (and so into its cache
    key): the policy records the user's ``torch.get_num_threads()`` in the region's ``Build``,
    which the compile helper (one thread of its own) and the user's process both compile with.
    (Each used its own: a process on 2 threads missed what the helper had compiled on 1 and
    compiled every program again itself, 13.6 s holding the GIL in the bench's W7 loop; 1.7 s
    of loading now.)"""
    import torch._inductor.compile_fx as cfx
    import torch._inductor.config as iconf
    seen = []
    monkeypatch.setattr(cfx, "compile_fx", lambda gm, ex: seen.append(iconf.cpp.threads))
    g = torch.fx.Graph()
    a = g.placeholder("in0")
    g.output((g.call_function(torch.ops.aten.relu.default, (a,)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    big = knobs.PARALLEL_MIN_NUMEL.get()
    with knobs.CPP_WRAPPER_OPS.scoped(0):
        programs.compile_program(gm, [torch.randn(3)], programs.Build(big, False, 3))
        programs.compile_program(gm, [torch.randn(3)], programs.Build(big - 1, False, 3))
        programs.compile_program(gm, [torch.randn(3)], programs.Build(big, False, 0))
    assert seen == [3, 1, torch.get_num_threads()]

    built = []
    monkeypatch.setattr(worker, "submit", lambda region, gm, ex, stats, build, floats:
                        built.append(build))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        x = torch.randn(64).to("neuron")
        with knobs.COMPILE_AFTER.scoped(1), knobs.SYNC_COMPILE.scoped(False):
            for _ in range(3):
                (x * 2 + 1).relu().sum().item()
    finally:
        torch.set_num_threads(before)
    assert built and all(b.threads == 2 for b in built)
