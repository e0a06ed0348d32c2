"""The "neuron" torch.compile backend: the three ways in, graph inputs/outputs on the device,
memory accounting and OOM as in eager. Oracle: the same module on CPU (eager)."""
import pytest
import torch

import neuron_lab
from neuron_lab.device import config


def to_cpu(t):
    return t.detach().cpu()

torch.manual_seed(0)


class MLP(torch.nn.Module):
    """A module of its own: ``nn.Sequential(...).compile()`` compiles nothing in torch 2.13
    (Module.compile compiles ``_call_impl``, and Sequential's forward is in dynamo's skip files)."""

    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def _mlp():
    torch.manual_seed(0)
    return MLP()


def test_backend_is_registered():
    assert "neuron" in torch._dynamo.list_backends(exclude_tags=())


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
@pytest.mark.parametrize("how", ["backend=neuron", "set_default_backend", "plain"])
def test_forward_matches_cpu(how, mode):
    m, x = _mlp(), torch.randn(5, 8)
    ref, ref2 = m(x), m(x * 2)
    mn, xn = _mlp().to("neuron"), x.to("neuron")
    neuron_lab.compile.outcomes.clear()
    with neuron_lab.mode(mode):
        if how == "backend=neuron":
            f = torch.compile(mn, backend="neuron")
        elif how == "set_default_backend":
            torch.compiler.set_default_backend("neuron")
            mn.compile()
            f = mn
        else:
            f = torch.compile(mn)          # inductor, the default: routed for neuron graphs
        out = f(xn)
        assert out.device == torch.device("neuron", 0)
        torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-6)
        out2 = f(xn * 2)                   # second call: the compiled program, same guards
        torch.testing.assert_close(out2.cpu(), ref2, rtol=1e-5, atol=1e-6)
    snap = neuron_lab.compile.outcomes.snapshot()
    assert snap["frames"] == 1 and snap["programs"] == 1, snap


def test_outputs_are_counted_and_freed():
    """Eager mode: in adaptive mode the slice below is a deferred op whose queue holds its
    input until the next boundary, which is the runtime's accounting, not the graph's."""
    with neuron_lab.mode("eager"):
        f = torch.compile(lambda a: (a.sin() + 1).reshape(-1), backend="neuron")
        a = torch.randn(256, 64).to("neuron")
        f(a)                                           # compile; result dropped at once
        before = torch.neuron.memory_allocated()
        y = f(a)
        assert torch.neuron.memory_allocated() == before + y.numel() * 4
        view = f(a)[:10]                               # a view keeps its base's storage counted
        assert torch.neuron.memory_allocated() == before + 2 * y.numel() * 4
        del y, view
        assert torch.neuron.memory_allocated() == before


def test_output_aliasing_an_input_is_the_input():
    f = torch.compile(lambda a: (a.t(), a + 1), backend="neuron")
    a = torch.randn(4, 6).to("neuron")
    v, b = f(a)
    before = torch.neuron.memory_allocated()
    v.mul_(2)                                      # writes through to a, as in eager
    torch.testing.assert_close(to_cpu(a), to_cpu(v).t())
    assert torch.neuron.memory_allocated() == before


def test_input_mutation_is_seen_by_the_caller():
    def f(a, b):
        a.add_(b)
        return a * 2

    cf = torch.compile(f, backend="neuron")
    a, b = torch.randn(8), torch.randn(8)
    an, bn = a.to("neuron"), b.to("neuron")
    out = cf(an, bn)
    ref = f(a, b)
    torch.testing.assert_close(an.cpu(), a)
    torch.testing.assert_close(out.cpu(), ref)


def test_oom_in_a_compiled_graph_leaves_tensors_valid():
    f = torch.compile(lambda a: a.repeat(64, 1) * 2, backend="neuron")
    a = torch.randn(1024, 256).to("neuron")        # 1 MiB; the output is 64 MiB
    small = torch.randn(4).to("neuron")
    f(torch.randn(2, 256).to("neuron"))            # compile with room (dynamic after the shape change later)
    used = torch.neuron.memory_allocated()
    with config.HBM_GB.scoped((used + (8 << 20)) / 2**30):
        with pytest.raises(torch.OutOfMemoryError, match="compiled .*graph"):
            f(a)
        assert torch.neuron.memory_allocated() == used
    assert torch.equal(small.cpu(), small.cpu()) and a.cpu().shape == (1024, 256)


def test_cpu_graphs_stay_on_cpu_with_the_neuron_default():
    torch.compiler.set_default_backend("neuron")
    f = torch.compile(lambda a: a.cos() * 3)
    a = torch.randn(10)
    out = f(a)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, a.cos() * 3)


def test_a_graph_moving_data_between_devices():
    def f(a, c):
        return (a * 2).cpu() + c, (c + 1).to("neuron") * a

    cf = torch.compile(f, backend="neuron")
    a, c = torch.randn(6), torch.randn(6)
    h, d = cf(a.to("neuron"), c)
    assert h.device.type == "cpu" and d.device.type == "neuron"
    rh, rd = f(a.to("neuron"), c)                  # eager on the device
    rd = rd.cpu()
    torch.testing.assert_close(h, rh)
    torch.testing.assert_close(d.cpu(), rd)


def test_compiled_code_runs_while_another_thread_fx_traces():
    """The adaptive runtime's background compiles FX-trace; FX's tracing flag is one global,
    and dynamo refused to run compiled code on the user's thread while it was set."""
    import threading

    from torch.fx import _symbolic_trace as st
    f = torch.compile(lambda a: a.sin() * 2, backend="neuron")
    x = torch.randn(4)
    f(x.to("neuron"))
    inside, release = threading.Event(), threading.Event()

    def traced(a):
        inside.set()
        release.wait(30)
        return a + 1

    t = threading.Thread(target=lambda: st.Tracer().trace(traced))
    t.start()
    try:
        assert inside.wait(30) and st._is_fx_tracing_flag
        torch.testing.assert_close(f(x.to("neuron")).cpu(), x.sin() * 2)
    finally:
        release.set()
        t.join()
