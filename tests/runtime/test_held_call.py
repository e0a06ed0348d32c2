"""``fused.held_call``: a fused launch calls its program with a C++ reference held on every input
tensor (runtime/csrc/held_call.cpp), so a program that runs without the GIL (inductor's C++
wrapper) frees its input handles without taking the GIL; ``held_call_py`` is its Python
reference (``program(*inputs)``).

Why it matters is a timing (docs/performance.md, the bench's W6); what is tested here is the
contract: the same call and result as the reference, one more C++ reference on each input tensor
for the call's length and none after it, errors passed through, and a fused launch that goes
through it.
"""
import pytest
import torch

from neuron_lab.runtime import core, fused, knobs

ext = core.extension()
pytestmark = pytest.mark.skipif(ext is None, reason="the runtime extension is not built")


def _counting(seen: list):
    """A program that records its arguments' C++ reference counts (None for non-tensors)."""
    def program(*inputs):
        seen.append([x._use_count() if isinstance(x, torch.Tensor) else None for x in inputs])
        return (inputs[0] * inputs[1], inputs[2])
    return program


def test_held_call_equals_the_python_reference():
    a, b = torch.randn(3, 4), torch.randn(4)
    got = fused.held_call(_counting([]), [a, b, 2.5])
    want = fused.held_call_py(_counting([]), [a, b, 2.5])
    assert torch.equal(got[0], want[0]) and got[1] == want[1] == 2.5


def test_each_input_tensor_is_held_for_the_call_and_let_go_after():
    a, b = torch.randn(3, 4), torch.randn(4)
    before = [a._use_count(), b._use_count()]
    held, plain = [], []
    fused.held_call(_counting(held), [a, b, 1.0])
    fused.held_call_py(_counting(plain), [a, b, 1.0])
    assert held == [[before[0] + 1, before[1] + 1, None]]
    assert plain == [[before[0], before[1], None]]
    assert [a._use_count(), b._use_count()] == before


def test_an_error_in_the_program_passes_through_and_lets_go():
    a = torch.randn(5)
    before = a._use_count()

    def fails(*inputs):
        raise ValueError("injected: the program failed")
    with pytest.raises(ValueError, match="injected"):
        fused.held_call(fails, [a])
    assert a._use_count() == before


def test_held_call_rejects_what_is_not_a_list():
    with pytest.raises(TypeError, match="held_call"):
        fused.held_call(lambda *a: a, (torch.ones(1),))


def test_a_fused_launch_holds_its_inputs_while_its_program_runs(monkeypatch):
    """A region's program (here built with the C++ wrapper) is called through ``held_call``:
    each input tensor has one more C++ reference than its Python object's while it runs."""
    real, seen = fused.held_call, []

    def spy(program, inputs):
        def counted(*xs):
            seen.append([x._use_count() for x in xs if isinstance(x, torch.Tensor)])
            return program(*xs)
        return real(counted, inputs)
    monkeypatch.setattr(fused, "held_call", spy)

    def cell(x):
        y = x
        for _ in range(10):
            y = y * 1.001 + 0.1
        return y.sum()
    x = torch.linspace(0, 1, 512, device="neuron")
    with knobs.TRIALS.scoped(0), knobs.CPP_WRAPPER_OPS.scoped(1):
        vals = [cell(x).item() for _ in range(8)]
    assert vals[-1] == pytest.approx(cell(torch.linspace(0, 1, 512)).item(), rel=1e-5)
    assert seen and all(counts and min(counts) >= 2 for counts in seen)
