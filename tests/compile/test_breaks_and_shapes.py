"""Graph breaks, compile failures and dynamic shapes on neuron, each against CPU eager."""
import pytest
import torch

import neuron_lab
from neuron_lab.compile import outcomes


def _branchy(x, w):
    y = torch.tanh(x @ w)
    if y.sum() > 0:                 # data-dependent branch: a graph break (a sync point)
        y = y * 2 + 1
    else:
        y = y - 3
    return y.relu().sum(dim=-1)


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
def test_graph_break_on_a_data_dependent_branch_matches(mode):
    outcomes.clear()
    f = torch.compile(_branchy, backend="neuron")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 6, generator=g)
    with neuron_lab.mode(mode):
        for sign in (1, -1, 1):
            x = sign * torch.rand(4, 6, generator=g)
            out = f(x.to("neuron"), w.to("neuron"))
            torch.testing.assert_close(out.cpu(), _branchy(x, w), rtol=1e-5, atol=1e-6)
    snap = outcomes.snapshot()
    assert snap["graph_breaks"] >= 1
    site = snap["graph_break_sites"][0]
    line = _branchy.__code__.co_firstlineno + 2
    assert site["location"].endswith(f"test_breaks_and_shapes.py:{line}"), site
    assert site["reason"]


def test_a_compile_failure_runs_the_graph_eagerly_and_is_recorded():
    outcomes.clear()

    def f(a):
        return (a * 3).sin() + a

    cf = torch.compile(f, backend="neuron", options={"_raise_error_for_testing": True})
    a = torch.randn(16)
    with pytest.warns(UserWarning, match="could not compile the graph at .*test_breaks_and_shapes.py"):
        out = cf(a.to("neuron"))
    assert out.device.type == "neuron"
    assert torch.equal(out.cpu(), f(a))          # eager on neuron: bitwise CPU's
    snap = outcomes.snapshot()
    assert snap["failures"] == 1 and snap["programs"] == 0
    fail = snap["recent_failures"][0]
    assert fail["fallback"] == "eager" and "test_breaks_and_shapes.py:" in fail["location"]
    assert torch.equal(cf(a.to("neuron")).cpu(), f(a))   # the next call: still eager, same result


def _head(x, w):
    return torch.softmax(x @ w, dim=-1).mean(dim=1)


def test_variable_lengths_compile_few_graphs():
    """Sequence lengths 5..40: one static graph, then one dynamic graph after the first change
    (automatic dynamic); no recompile per length."""
    outcomes.clear()
    f = torch.compile(_head, backend="neuron")
    w = torch.randn(16, 8)
    wn = w.to("neuron")
    for t in (5, 9, 13, 21, 33, 40):
        x = torch.randn(2, t, 16)
        torch.testing.assert_close(f(x.to("neuron"), wn).cpu(), _head(x, w), rtol=1e-5, atol=1e-6)
    snap = outcomes.snapshot()
    assert snap["programs_by_kind"].get("inference", 0) <= 2, snap["recent_programs"]
    assert snap["frames"] == 2 and snap["recompiles"] == 1
    (rec,) = snap["recent_recompiles"]
    assert "tensor 'x' size mismatch at index 1" in rec["failed_guard"] and rec["function"] == "_head"


def test_mark_dynamic_compiles_one_graph():
    outcomes.clear()
    f = torch.compile(_head, backend="neuron")
    w = torch.randn(16, 8).to("neuron")
    for t in (7, 12, 30):
        x = torch.randn(2, t, 16)
        xn = x.to("neuron")
        torch._dynamo.mark_dynamic(xn, 1)
        torch.testing.assert_close(f(xn, w).cpu(), _head(x, w.cpu()), rtol=1e-5, atol=1e-6)
    snap = outcomes.snapshot()
    assert snap["programs_by_kind"].get("inference", 0) == 1


def test_metrics_show_graphs_breaks_recompiles_and_time():
    import json
    outcomes.clear()
    f = torch.compile(_branchy, backend="neuron")
    w = torch.randn(6, 6).to("neuron")
    f(torch.rand(4, 6).to("neuron"), w)
    f(torch.rand(5, 6).to("neuron"), w)          # a new batch size: one recompile
    m = neuron_lab.metrics()
    json.dumps(m)
    tc = m["torch_compile"]
    assert tc["programs"] >= 2 and tc["graph_breaks"] >= 1 and tc["recompiles"] >= 1
    assert tc["dynamo_compile_seconds"] > 0
    report = neuron_lab.metrics_report()
    assert "Metric: TorchCompile" in report and "graph break x" in report
    assert "recompile of _branchy" in report


def test_neuron_compile_magic_lists_programs_breaks_and_recompiles():
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "neuron_lab")
    outcomes.clear()
    f = torch.compile(_branchy, backend="neuron")
    w = torch.randn(6, 6).to("neuron")
    f(torch.rand(4, 6).to("neuron"), w)
    f(torch.rand(5, 6).to("neuron"), w)
    text = repr(ip.run_line_magic("neuron_compile", ""))
    assert "torch.compile on neuron" in text and "Data-dependent branching" in text
    assert "recompiles" in text and "size mismatch" in text
