"""Training steps compiled on neuron (forward, backward through AOTAutograd, and the
optimizer's step under torch.compile) against the same steps in CPU eager.

Tolerance: rtol 1e-4 / atol 1e-5 on the state after the steps — inductor reorders float32
reductions (last-bit differences) and Adam divides by sqrt(v), which amplifies them."""
import pytest
import torch
from torch import nn

import neuron_lab


def _mlp():
    return nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 5))


def _convnet():
    # no bias before BatchNorm: its gradient is ~0 and Adam's normalisation of that noise is
    # not a meaningful comparison (CPU compiled vs CPU eager differ there by 3e-2 as well)
    return nn.Sequential(nn.Conv2d(3, 6, 3, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(6 * 3 * 3, 5))


_INPUT = {"mlp": (12,), "conv": (3, 8, 8)}


def _train(kind, device, compiled, steps=3, opt_cls=torch.optim.AdamW):
    torch.manual_seed(0)
    model = (_mlp if kind == "mlp" else _convnet)().to(device)
    opt = opt_cls(model.parameters(), lr=1e-2)
    fwd = torch.compile(model, backend="neuron") if compiled else model
    step = torch.compile(opt.step, backend="neuron") if compiled else opt.step
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(4, *_INPUT[kind], generator=g).to(device)
        y = torch.randint(0, 5, (4,), generator=g).to(device)
        loss = nn.functional.cross_entropy(fwd(x), y)
        loss.backward()
        step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind", ["mlp", "conv"])
def test_compiled_training_matches_cpu_eager(kind):
    ref_losses, ref_state = _train(kind, "cpu", compiled=False)
    programs = neuron_lab.compile.outcomes.snapshot()["programs"]
    losses, state = _train(kind, "neuron", compiled=True)
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    for k, v in ref_state.items():
        torch.testing.assert_close(state[k], v, rtol=1e-4, atol=1e-5, msg=k)
    kinds = [p["kind"] for p in neuron_lab.compile.outcomes.snapshot()["recent_programs"]]
    # forward + backward of the model, and the optimizer step (an inference graph)
    assert neuron_lab.compile.outcomes.snapshot()["programs"] - programs >= 3
    assert {"forward", "backward", "inference"} <= set(kinds)


def test_compiled_sgd_momentum_in_eager_mode():
    ref_losses, ref_state = _train("mlp", "cpu", compiled=False, opt_cls=torch.optim.SGD)
    with neuron_lab.mode("eager"):
        losses, state = _train("mlp", "neuron", compiled=True, opt_cls=torch.optim.SGD)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    for k, v in ref_state.items():
        torch.testing.assert_close(state[k], v, rtol=1e-5, atol=1e-6, msg=k)


def test_tracing_a_backward_is_not_a_step_boundary():
    """AOTAutograd traces a compiled module's backward with fake tensors (``autograd.grad``
    under its modes): that pass computes nothing, so it does not end the adaptive runtime's
    segment. Flushing there ran the user's queued ops under the tracer's fake mode (they failed,
    and their values with them). A real ``backward()`` does end it."""
    from neuron_lab import runtime
    from neuron_lab.runtime import knobs
    torch.manual_seed(0)
    model = _mlp()
    x = torch.randn(4, 13)
    want = model(x[:, :-1] * 2)
    model = model.to("neuron")
    fwd = torch.compile(model, backend="neuron")
    with neuron_lab.mode("adaptive"), knobs.BACKWARD_BOUNDARY.scoped(True):
        dx = x.to("neuron")
        for _ in range(3):                 # from the second pass on, the input is deferred
            inp = dx[:, :-1] * 2
            before = runtime.stats()["flushes"].get("backward", 0)
            out = fwd(inp)                 # the first call traces forward and backward
            assert runtime.stats()["flushes"].get("backward", 0) == before
            torch.testing.assert_close(out.detach().cpu(), want.detach(), rtol=1e-4, atol=1e-5)
            out.sum().backward()
            assert runtime.stats()["flushes"].get("backward", 0) == before + 1
