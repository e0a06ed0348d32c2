"""Fused programs (real torch inductor): used when faster, allclose to eager, failures fall back.

Tolerances: fused programs may reassociate float32 reductions; we use rtol=1e-5, atol=1e-6.
"""
import pytest
import torch

import neuron_lab
from neuron_lab import runtime
from neuron_lab.runtime import knobs, programs


def _cell(x):
    y = x
    for _ in range(10):
        y = y * 1.001 + 0.1
    return y.sum()


def test_hot_region_compiles_and_runs_fused():
    x = torch.linspace(0, 1, 4096, device="neuron")
    neuron_lab.sync()
    ref = _cell(torch.linspace(0, 1, 4096))
    with knobs.TRIALS.scoped(1):
        vals = [_cell(x).item() for _ in range(6)]
    s = runtime.stats()
    assert s["compiles_done"] == 1 and s["compiles_failed"] == 0
    assert s["launches_fused"] >= 1 and s["ops_fused"] >= 21
    for v in vals:
        assert v == pytest.approx(ref.item(), rel=1e-5)
    (r,) = [r for r in runtime.regions() if r["ops"] == 21]
    assert r["status"] in ("fused", "slower") and r["fused_us"] is not None


def test_compile_failure_falls_back_and_is_recorded(monkeypatch):
    def boom(gm, examples, *a, **k):
        raise RuntimeError("injected compiler failure")
    monkeypatch.setattr(programs, "compile_program", boom)
    x = torch.ones(256, device="neuron")
    neuron_lab.sync()
    vals = [_cell(x).item() for _ in range(5)]
    assert len(set(vals)) == 1 and vals[0] == pytest.approx(_cell(torch.ones(256)).item())
    s = runtime.stats()
    assert s["compiles_failed"] == 1 and s["launches_fused"] == 0
    (r,) = [r for r in runtime.regions() if r["ops"] == 21]
    assert r["status"] == "failed" and "injected compiler failure" in r["error"]


def test_fused_optimizer_update_mutates_parameters_in_place():
    torch.manual_seed(0)
    p_cpu = torch.randn(64)
    p = p_cpu.to("neuron")
    g = torch.full((64,), 0.5, device="neuron")
    for _ in range(6):
        p.mul_(0.9).add_(g, alpha=-0.1).clamp_(-2, 2)
        p.sum().item()
    ref = p_cpu.clone()
    for _ in range(6):
        ref.mul_(0.9).add_(torch.full((64,), 0.5), alpha=-0.1).clamp_(-2, 2)
    torch.testing.assert_close(p.cpu(), ref, rtol=1e-5, atol=1e-6)
    assert runtime.stats()["launches_fused"] >= 1


def test_float_scalars_are_program_inputs():
    """A per-step Python float (a scheduled lr, AdamW's bias corrections) does not make each
    step a new region: the fused program takes it as an input and follows its value."""
    p_cpu = torch.linspace(-1, 1, 256)
    p = p_cpu.to("neuron")
    g = torch.full((256,), 0.5, device="neuron")
    ref = p_cpu.clone()
    lrs = [0.1 / (1 + i) for i in range(8)]
    with knobs.TRIALS.scoped(1):
        for lr in lrs:
            p.mul_(1 - lr * 0.01).add_(g, alpha=-lr).clamp_(-2, 2)
            p.sum().item()
    for lr in lrs:
        ref.mul_(1 - lr * 0.01).add_(torch.full((256,), 0.5), alpha=-lr).clamp_(-2, 2)
    torch.testing.assert_close(p.cpu(), ref, rtol=1e-5, atol=1e-6)
    s = runtime.stats()
    assert s["hits"] >= 6 and s["launches_fused"] >= 2 and s["compiles_failed"] == 0
    (r,) = [r for r in runtime.current().engine.cache.regions() if r.ops == 4]
    assert len(r.plan.scalars) == 2            # mul_'s factor and add_'s alpha


def test_constant_floats_are_compiled_in_then_become_data_when_they_change():
    """Floats the same at every launch before the compile are constants in the program
    (guarded); the first launch with other floats runs per-op, and the region is compiled
    again with its floats as inputs, which then follows every value."""
    x_cpu = torch.linspace(-1, 1, 512)
    x = x_cpu.to("neuron")

    def body(a, s):
        return ((a * s + 0.5).clamp_min(-0.25) * 2.0).sum()
    with knobs.TRIALS.scoped(0):
        for _ in range(4):
            assert body(x, 1.5).item() == pytest.approx(body(x_cpu, 1.5).item(), rel=1e-5)
        (r,) = [r for r in runtime.current().engine.cache.regions() if r.ops == 5]
        assert isinstance(r.program, programs.Specialized) and r.program.chosen
        assert r.program.fixed == [1.5, 0.5, -0.25, 2.0]
        fused = runtime.stats()["launches_fused"]
        assert fused >= 1
        for s in (0.7, 0.9, 1.1, 1.3, 1.5, 1.7):            # the scale changes every launch
            assert body(x, s).item() == pytest.approx(body(x_cpu, s).item(), rel=1e-5)
    assert runtime.stats()["compiles_done"] == 2 and runtime.stats()["compiles_failed"] == 0
    assert r.program is not None and not isinstance(r.program, programs.Specialized)
    assert len(r.plan.scalars) == 4
    assert runtime.stats()["launches_fused"] >= fused + 3     # the data-float program runs


def test_constant_floats_that_change_under_verify(recwarn):
    """NEURON_LAB_VERIFY checks a specialized program's launches too; the launch whose floats
    differ is per-op (no error, no mismatch), as without VERIFY."""
    x_cpu = torch.linspace(-1, 1, 256)
    x = x_cpu.to("neuron")

    def body(a, s):
        return ((a * s + 0.5).clamp_min(-0.25) * 2.0).sum()
    with knobs.TRIALS.scoped(0), knobs.VERIFY.scoped(True):
        for s in (1.5, 1.5, 1.5, 0.7, 0.9):
            assert body(x, s).item() == pytest.approx(body(x_cpu, s).item(), rel=1e-5)
    st = runtime.stats()
    assert st["verify_mismatches"] == 0 and st["compiles_failed"] == 0
    assert st["compiles_done"] == 2


def test_background_compile_shares_the_gil_in_short_slices():
    """While the worker compiles, the switch interval is NEURON_LAB_COMPILE_SWITCH_US (the
    user's thread waits at most that long per op for the GIL), restored afterwards; results
    are those of the per-op path meanwhile."""
    import sys
    default = sys.getswitchinterval()
    x = torch.linspace(0, 1, 4096, device="neuron")
    neuron_lab.sync()
    ref = _cell(torch.linspace(0, 1, 4096)).item()
    seen = set()
    with knobs.SYNC_COMPILE.scoped(False), knobs.TRIALS.scoped(1):
        vals = [_cell(x).item() for _ in range(3)]        # the second hit queues the compile
        while runtime.stats()["compiles_pending"]:
            vals.append(_cell(x).item())
            seen.add(sys.getswitchinterval())
        runtime.wait_compiles()
    assert runtime.stats()["compiles_done"] == 1
    assert min(seen) == pytest.approx(knobs.COMPILE_SWITCH_US.get() / 1e6)
    assert sys.getswitchinterval() == default
    assert all(v == pytest.approx(ref, rel=1e-5) for v in vals)


def _watch_compiles(monkeypatch, read, refuse=lambda: False) -> list:
    """Patch inductor's ``compile_fx``: each call appends ``read()`` (the config it runs under)
    to the returned list; a call for which ``refuse()`` is true raises, as a failed build does."""
    from torch._inductor import compile_fx as cfx
    seen, real = [], cfx.compile_fx

    def spy(gm, examples, *a, **k):
        seen.append(read())
        if refuse():
            raise RuntimeError("injected: inductor cannot build this graph")
        return real(gm, examples, *a, **k)
    monkeypatch.setattr(cfx, "compile_fx", spy)
    return seen


def _fused_cells(n: int) -> None:
    """``n`` runs of ``_cell`` (one 21-op region); checks each value against CPU's."""
    x = torch.linspace(0, 1, 512, device="neuron")
    vals = [_cell(x).item() for _ in range(n)]
    assert all(v == pytest.approx(_cell(torch.linspace(0, 1, 512)).item(), rel=1e-5) for v in vals)


def test_compiles_use_one_compile_worker(monkeypatch):
    """Inductor compiles the runtime's regions with NEURON_LAB_COMPILE_THREADS workers (1: no
    process pool competing with the user's loop, bench W7); the process's own setting (for
    the user's torch.compile) is left as it was."""
    import torch._inductor.config as iconf
    seen = _watch_compiles(monkeypatch, lambda: iconf.compile_threads)
    with knobs.TRIALS.scoped(0), iconf.patch({"compile_threads": 2}):   # the process's setting
        _fused_cells(4)
        assert iconf.compile_threads == 2
    assert runtime.stats()["compiles_done"] == 1 and seen[0] == knobs.COMPILE_THREADS.get() == 1


@pytest.mark.parametrize("least, cpp", [(1, True), (10_000, False)])
def test_programs_of_many_ops_get_the_cpp_wrapper(monkeypatch, least, cpp):
    """A program of at least NEURON_LAB_CPP_WRAPPER_OPS ATen calls is compiled with inductor's
    C++ wrapper (its launch runs without the GIL between kernels); smaller ones keep the Python
    wrapper. Either way the values are CPU's."""
    import torch._inductor.config as iconf
    seen = _watch_compiles(monkeypatch, lambda: iconf.cpp_wrapper)
    with knobs.TRIALS.scoped(0), knobs.CPP_WRAPPER_OPS.scoped(least):
        _fused_cells(8)
    s = runtime.stats()
    assert s["compiles_done"] == 1 and s["launches_fused"] >= 1 and seen == [cpp]


def test_a_region_launched_beside_the_host_gets_the_cpp_wrapper_whatever_its_size(monkeypatch):
    """A training loop that never reads a value, with the device's thread on
    (``NEURON_LAB_ASYNC=1``): its regions end at the optimizer's boundaries, nobody waits for
    their launches, so their programs run on the device's thread beside the host's Python and get the C++ wrapper although they are far under the size
    threshold; a loop that reads every value (``_fused_cells``) keeps the Python wrapper. The
    trained parameters are CPU's."""
    import torch._inductor.config as iconf
    seen = _watch_compiles(monkeypatch, lambda: iconf.cpp_wrapper)

    def train(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 4)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x, y = torch.randn(8, 16).to(device), torch.randn(8, 4).to(device)
        for _ in range(12):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        return [p.detach().cpu() for p in model.parameters()]
    with knobs.TRIALS.scoped(0), knobs.CPP_WRAPPER_OPS.scoped(10_000), knobs.ASYNC.scoped(True):
        got = train("neuron")
        runtime.wait_compiles()
        got = train("neuron")
        want = train("cpu")
        assert seen and all(seen), seen
        seen.clear()
        runtime.reset()
        _fused_cells(8)
        assert seen == [False]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_a_graph_the_cpp_wrapper_cannot_build_gets_the_python_wrapper(monkeypatch):
    """The C++ wrapper's build fails: the same graph is compiled again with the Python wrapper
    and runs fused; the region is not counted as a failed compile."""
    import torch._inductor.config as iconf
    seen = _watch_compiles(monkeypatch, lambda: iconf.cpp_wrapper, refuse=lambda: iconf.cpp_wrapper)
    with knobs.TRIALS.scoped(0), knobs.CPP_WRAPPER_OPS.scoped(1):
        _fused_cells(8)
    s = runtime.stats()
    assert seen == [True, False]
    assert s["compiles_done"] == 1 and s["compiles_failed"] == 0 and s["launches_fused"] >= 1


def test_a_host_gap_op_fuses_with_its_substitute():
    """int histc (device/host_gaps.py) inside a region: the fused program's graph holds the
    substitute (CPU's aten kernel refuses int), so the region compiles and runs fused."""
    def cell(ids):
        counts = torch.histc(ids * 1, bins=4, min=0, max=3)
        return (counts * 2 + 1).sum()
    ids = torch.tensor([0, 1, 1, 3, 2, 3, 3], device="neuron", dtype=torch.int32)
    neuron_lab.sync()
    with knobs.TRIALS.scoped(0):
        vals = [cell(ids).item() for _ in range(6)]
    assert vals == [2 * 7 + 4] * 6
    s = runtime.stats()
    assert s["compiles_failed"] == 0 and s["compiles_done"] >= 1 and s["launches_fused"] >= 1


def test_adamw_step_fuses_its_scalar_list_foreach_ops():
    """AdamW (foreach) divides by its bias corrections and steps by its step sizes with
    ``_foreach_div_.ScalarList`` / ``_foreach_addcdiv_.ScalarList``, whose scalars change every
    step (program inputs). The fused program runs them as per-tensor ops inside its kernels:
    no ATen foreach kernel is called during a fused launch, and the parameters follow CPU's."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(32, 16)
    model = torch.nn.Linear(32, 16).to("neuron")
    model.load_state_dict(ref.state_dict())
    x_cpu = torch.randn(8, 32)
    x = x_cpu.to("neuron")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True) for m in (ref, model)]

    def step(m, opt, inp):
        opt.zero_grad()
        m(inp).square().mean().backward()
        opt.step()
    with knobs.TRIALS.scoped(0):
        for _ in range(6):
            step(ref, opts[0], x_cpu)
            step(model, opts[1], x)
            neuron_lab.sync()
        fused = runtime.stats()["launches_fused"]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step(model, opts[1], x)
            neuron_lab.sync()
        step(ref, opts[0], x_cpu)
    assert runtime.stats()["compiles_failed"] == 0
    assert runtime.stats()["launches_fused"] >= fused + 2        # forward+backward, AdamW

    def in_program(e):                      # called by a compiled program (not by the user)
        while e is not None and not e.name.startswith("## Call CompiledFxGraph"):
            e = e.cpu_parent
        return e is not None
    in_programs = {e.name for e in prof.events() if in_program(e)}
    assert any(n.startswith("## Call CompiledFxGraph") for n in in_programs)
    assert not any(n.startswith("aten::_foreach") for n in in_programs), sorted(in_programs)
    for p, q in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-5, atol=1e-6)
