"""The direct kernel's call into Python (device/csrc/python_call.cpp): an op it does not run
itself reaches ``runtime_interface.launch`` with the arguments PyTorch's Python kernel holder would
hand a Python kernel, so the engine's keys, the eager path and error messages see what they saw
before. The oracle is the holder itself: the same op and arguments redispatched to a Python
kernel registered under PrivateUse3."""
import pytest
import torch

import neuron_lab
from neuron_lab.device import config, executor, registry, runtime_interface
from neuron_lab.device.op_facts import facts, overload

pytestmark = pytest.mark.skipif(
    registry._native is None or not config.DIRECT.get() or executor.host_device().type != "cpu",
    reason="the direct kernel runs on the CPU executor with the native extension built")

aten = torch.ops.aten


def calls(a, b, i):
    """(overload, args, kwargs): defaults given and left out, keyword-only arguments, Python
    numbers, int lists, dtypes, memory formats, None."""
    return [
        (aten.add.Tensor, (a, b), {}),
        (aten.add.Tensor, (a, b), {"alpha": 2}),
        (aten.add.Tensor, (a, b), {"alpha": 1}),            # the default: left out
        (aten.mul.Scalar, (a, 1.5), {}),                   # Scalars (``a * 1.5``'s wrapped
        (aten.add.Scalar, (a, 3), {"alpha": 2}),           # numbers: test_direct_kernel)
        (aten.mul.Scalar, (a, True), {}),
        (aten.sum.dim_IntList, (a, [1]), {}),
        (aten.sum.dim_IntList, (a, [1], True), {}),
        (aten.sum.dim_IntList, (a, [0, 1], False), {"dtype": torch.float32}),
        (aten.sum.dim_IntList, (a, None), {}),
        (aten.view.default, (a, [2, 8]), {}),
        (aten.slice.Tensor, (a, 0, 1, 3), {}),
        (aten.slice.Tensor, (a, 1, None, None, 2), {}),
        (aten.transpose.int, (a, 0, 1), {}),
        (aten.clamp.default, (a, -0.5), {}),
        (aten.clamp.default, (a, None, 0.5), {}),
        (aten.clone.default, (a,), {"memory_format": torch.contiguous_format}),
        (aten.clone.default, (a,), {}),
        (aten._to_copy.default, (a,), {"dtype": torch.float16}),
        (aten.add_.Tensor, (b.clone(), a), {"alpha": 0.5}),
        (aten.index_select.default, (a, 1, i), {}),
        (aten.cumsum.default, (a, 1), {"dtype": torch.float32}),
    ]


def facts_of(name: str):
    return facts(overload(name))


def same(x, y) -> bool:
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return x is y
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(same(p, q) for p, q in zip(x, y))
    if isinstance(x, dict):
        return type(y) is dict and x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    return type(x) is type(y) and x == y


def test_the_direct_kernel_hands_python_the_holders_arguments(monkeypatch):
    a = torch.randn(4, 4).to("neuron")
    b = torch.randn(4, 4).to("neuron")
    i = torch.tensor([0, 2]).to("neuron")
    cases = calls(a, b, i)
    ours, theirs = [], []
    original = runtime_interface.launch

    def record(f, args, kwargs):
        ours.append((f.name, args, kwargs))
        return original(f, args, kwargs)

    lib = torch.library.Library("aten", "IMPL")
    try:
        for op, args, kwargs in cases:
            name = op._schema.name[len("aten::"):] + (f".{op._overloadname}" if op._overloadname != "default" else "")
            lib.impl(name, lambda *a_, **k_: theirs.append((a_, k_)) or a_[0], "PrivateUse3")
        with neuron_lab.mode("eager"):
            monkeypatch.setattr(runtime_interface, "launch", record)
            runtime_interface.run_directly(False)           # every op takes the call into Python
            try:
                for op, args, kwargs in cases:
                    op(*args, **kwargs)
            finally:
                monkeypatch.setattr(runtime_interface, "launch", original)
                runtime_interface.run_directly(True)
        keys = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse3)
        for op, args, kwargs in cases:
            op.redispatch(keys, *args, **kwargs)
    finally:
        lib._destroy()
    assert len(ours) == len(theirs) == len(cases), [n for n, _, _ in ours]
    direct = [name for name, _, _ in ours if facts_of(name).direct_kernel]
    assert len(direct) == len(cases) - 1, direct          # _to_copy: the holder
    for (name, args, kwargs), (want_args, want_kwargs) in zip(ours, theirs):
        assert type(args) is tuple and type(kwargs) is dict
        # the redispatched call gets fresh tensors for None-free lists etc.: compare structure,
        # tensors by identity
        assert same(args, want_args), (name, args, want_args)
        assert same(kwargs, want_kwargs), (name, kwargs, want_kwargs)


def test_a_python_error_keeps_its_type_and_message():
    """An error raised by the generic kernel reaches the caller as the holder's did: the
    device's own exception type and message (here a device mismatch)."""
    a = torch.randn(3).to("neuron")
    with pytest.raises(RuntimeError, match="neuron"):
        a + torch.randn(3)              # a CPU tensor that is not a 0-dim scalar
    with neuron_lab.mode("adaptive"):
        with pytest.raises(RuntimeError, match="neuron"):
            a + torch.randn(3)


def test_backward_on_the_autograd_device_thread_calls_python_too():
    """The autograd engine's device thread (its own Python thread state) takes the same way:
    a CPU root over a neuron graph runs the neuron part there (patches.backward)."""
    x = torch.randn(5, 3, requires_grad=True)
    n = x.detach().to("neuron").requires_grad_()
    with neuron_lab.mode("adaptive"):
        (n.tanh() * 2).cpu().sum().backward()
        neuron_lab.sync()
    (x.tanh() * 2).sum().backward()
    assert torch.allclose(n.grad.cpu(), x.grad)
