"""Autograd on ``neuron`` equals autograd on CPU: graphs, hooks, grad modes, ``.data``, higher order.

PyTorch runs a non-CPU device's backward pass on its own device thread; the device runs the
backward of ``neuron`` roots on the calling thread instead (``device/patches.backward``), and a
``neuron`` graph reached from a CPU root still takes the device thread. These tests check that
work done on either thread (hooks, accumulation) lands in the same place as on CPU.
"""
import threading

import pytest
import torch
from torch import nn


def _pair(*shape, seed=0):
    c = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return c.clone().requires_grad_(), c.to("neuron").requires_grad_()


def test_backward_equals_cpu_and_accumulates(any_mode):
    xc, xn = _pair(5, 3)
    for x in (xc, xn):
        y = (x.sin() * x.t().mm(x).sum(0)).pow(2).mean()
        y.backward(retain_graph=True)
        y.backward()                                     # retain_graph: a second pass accumulates
    assert xn.grad.device.type == "neuron"
    assert torch.equal(xn.grad.cpu(), xc.grad)


def test_second_backward_without_retain_graph_raises():
    _, xn = _pair(3)
    y = (xn.exp() * 2).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


def test_tensor_hooks(any_mode):
    out = {}
    for dev, x in zip(("cpu", "neuron"), _pair(4)):
        seen = []
        x.register_hook(lambda g: seen.append(g.detach().cpu()))
        mid = x * 3
        mid.register_hook(lambda g: g * 10)             # a hook may replace the gradient
        mid.retain_grad()
        (mid * mid).sum().backward()
        out[dev] = (x.grad.cpu(), mid.grad.cpu(), seen)
    assert torch.equal(out["cpu"][0], out["neuron"][0])
    assert torch.equal(out["cpu"][1], out["neuron"][1])
    assert len(out["neuron"][2]) == 1 and torch.equal(out["cpu"][2][0], out["neuron"][2][0])


def test_module_hooks(any_mode):
    calls = {"cpu": [], "neuron": []}
    for dev in calls:
        torch.manual_seed(0)
        m = nn.Linear(3, 2).to(dev)
        log = calls[dev]
        m.register_forward_pre_hook(lambda mod, inp: log.append(("pre", inp[0].device.type)))
        m.register_forward_hook(lambda mod, inp, o: log.append(("fwd", o.detach().cpu())))
        m.register_full_backward_hook(lambda mod, gi, go: log.append(("bwd", go[0].cpu())))
        m(torch.ones(4, 3, device=dev, requires_grad=True)).pow(2).sum().backward()
        log.append(("grad", m.weight.grad.cpu()))
    assert [c[0] for c in calls["neuron"]] == ["pre", "fwd", "bwd", "grad"]
    assert calls["neuron"][0][1] == "neuron"
    for (_, a), (_, b) in zip(calls["cpu"][1:], calls["neuron"][1:]):
        assert torch.equal(a, b)


def test_no_grad_inference_mode_enable_grad():
    _, x = _pair(3)
    with torch.no_grad():
        y = x * 2
        with torch.enable_grad():
            z = x * 2
    assert not y.requires_grad and z.requires_grad
    with torch.inference_mode():
        w = x * 2
    assert w.is_inference() and not w.requires_grad and w.device.type == "neuron"
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        (x * w).sum().backward()
    x.detach().requires_grad_(False)
    assert x.detach().device.type == "neuron" and not x.detach().requires_grad


def test_data_and_detach_share_storage(any_mode):
    p = nn.Parameter(torch.ones(3, device="neuron"))
    p.data.mul_(3)                                       # .data: a C++ shallow copy
    assert torch.equal(p.detach().cpu(), torch.full((3,), 3.0))
    p.data = torch.arange(3.0, device="neuron")          # swap the storage under a Parameter
    assert torch.equal(p.detach().cpu(), torch.arange(3.0)) and isinstance(p, nn.Parameter)
    (p * p).sum().backward()
    assert torch.equal(p.grad.cpu(), 2 * torch.arange(3.0))
    d = p.detach()
    d[0] = 7.0
    assert p[0].item() == 7.0


def test_autograd_grad_and_higher_order(any_mode):
    res = {}
    for dev, x in zip(("cpu", "neuron"), _pair(4, seed=3)):
        y = (x.tanh() ** 3).sum()
        (g,) = torch.autograd.grad(y, x, create_graph=True)
        (gg,) = torch.autograd.grad(g.sum(), x)
        res[dev] = (g.detach().cpu(), gg.cpu())
    assert torch.equal(res["cpu"][0], res["neuron"][0])
    assert torch.equal(res["cpu"][1], res["neuron"][1])


def test_functional_jacobian_and_vjp(any_mode):
    f = lambda t: (t.exp() * t.flip(0)).cumsum(0)        # noqa: E731
    xc, xn = _pair(4, seed=5)
    jc = torch.autograd.functional.jacobian(f, xc.detach())
    jn = torch.autograd.functional.jacobian(f, xn.detach())
    assert jn.device.type == "neuron" and torch.equal(jn.cpu(), jc)


def test_grad_of_non_leaf_views_and_inplace(any_mode):
    res = {}
    for dev, x in zip(("cpu", "neuron"), _pair(3, 4, seed=7)):
        y = x.clone()
        y[:, 1].mul_(5)                                  # in-place on a view of a graph tensor
        y.t()[0].add_(y[2].detach().sum())
        y.sum().backward()
        res[dev] = x.grad.cpu()
    assert torch.equal(res["cpu"], res["neuron"])


def test_custom_autograd_function(any_mode):
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    xc, xn = _pair(5)
    Square.apply(xc).sum().backward()
    Square.apply(xn).sum().backward()
    assert torch.equal(xn.grad.cpu(), xc.grad)


def _hook_threads(root_on_cpu: bool, use_grad: bool = False):
    """The threads a backward pass ran a neuron tensor's hook on, and the gradient."""
    seen = []
    x = torch.randn(4, generator=torch.Generator().manual_seed(1)).to("neuron").requires_grad_()
    x.register_hook(lambda g: seen.append(threading.get_ident()))
    y = (x.sin() * 2)
    loss = (y.cpu() if root_on_cpu else y).sum()
    if use_grad:
        (g,) = torch.autograd.grad(loss, x)
    else:
        loss.backward()
        g = x.grad
    return seen, g.cpu(), (x.detach().cpu().cos() * 2)


def test_backward_of_neuron_roots_runs_on_the_calling_thread(any_mode):
    for use_grad in (False, True):
        seen, g, want = _hook_threads(root_on_cpu=False, use_grad=use_grad)
        assert seen == [threading.get_ident()]
        assert torch.allclose(g, want)
        assert torch._C._is_multithreading_enabled()       # the switch is back on after


def test_a_cpu_root_over_a_neuron_graph_takes_the_device_thread(any_mode):
    seen, g, want = _hook_threads(root_on_cpu=True)
    assert len(seen) == 1 and seen[0] != threading.get_ident()
    assert torch.allclose(g, want)


def test_multithreading_switch_restored_when_backward_raises():
    x = torch.randn(3).to("neuron").requires_grad_()

    def boom(g):
        raise ValueError("from a hook")
    x.register_hook(boom)
    with pytest.raises(ValueError, match="from a hook"):
        (x * 2).sum().backward()
    assert torch._C._is_multithreading_enabled()
    with torch.autograd.set_multithreading_enabled(False):   # the user's own choice is kept
        y = torch.randn(3).to("neuron").requires_grad_()
        (y * 2).sum().backward()
        assert not torch._C._is_multithreading_enabled()
    assert torch._C._is_multithreading_enabled()
