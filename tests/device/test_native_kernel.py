"""The generic kernel and the eager short path in C (device/csrc/kernel.cpp) against the Python
functions they stand in for (``registry._kernel``'s closure, ``kernels.execute_py``)."""
import pytest
import torch

import neuron_lab
from neuron_lab.device import kernels, memory, registry, tensor_data, tracking
from neuron_lab.device.op_facts import facts

pytestmark = pytest.mark.skipif(registry._native is None, reason="native extension not built")

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def eager():
    with neuron_lab.mode("eager"):
        yield


def test_the_kernel_and_execute_are_the_c_ones():
    assert kernels.execute is not kernels.execute_py
    assert type(kernels.execute).__name__ == "builtin_function_or_method"


CALLS = [
    (aten.mul.Tensor, lambda n: (n, 1.5), {}),                      # plain: the C short path
    (aten.add.Tensor, lambda n: (n, n), {"alpha": 2}),              # kwargs: the general path
    (aten.tanh.default, lambda n: (n.t(),), {}),                     # a strided input
    (aten.mul.Tensor, lambda n: (n, torch.tensor(2.0)), {}),        # a CPU scalar tensor
    (aten.cat.default, lambda n: ([n, n], 1), {}),                  # a list: general path
    (aten.t.default, lambda n: (n,), {}),                            # a view
    (aten.sum.dim_IntList, lambda n: (n, [0]), {}),
    (aten.conj_physical.default, lambda n: (n,), {}),
]


@pytest.mark.parametrize("op,make,kwargs", CALLS, ids=[str(c[0]) for c in CALLS])
def test_c_execute_equals_the_python_reference(op, make, kwargs):
    x = torch.randn(3, 3)
    n = x.to("neuron")
    f = facts(op)
    args = make(n)
    before = tracking.executed[f.name]
    got = kernels.execute(f, args, kwargs)
    want = kernels.execute_py(f, args, kwargs)
    assert tracking.executed[f.name] == before + 2            # each counted once
    assert got.device.type == "neuron" and want.device.type == "neuron"
    assert (got.shape, got.stride(), got.storage_offset(), got.dtype) == \
        (want.shape, want.stride(), want.storage_offset(), want.dtype)
    assert torch.equal(got.cpu(), want.cpu())
    cpu = op(*torch.utils._pytree.tree_map(
        lambda a: a.cpu() if isinstance(a, torch.Tensor) else a, list(args)), **kwargs)
    assert torch.equal(got.cpu(), cpu)
    assert got.untyped_storage().data_ptr() != 0               # bound to its host bytes
    assert memory.is_counted(tensor_data.host_storage(got))     # its host bytes are counted


def test_a_new_tensor_from_the_c_path_is_counted_and_freed():
    n = torch.randn(1024).to("neuron")
    base = torch.neuron.memory_allocated()
    y = n * 2.0
    assert torch.neuron.memory_allocated() == base + 4096
    del y
    assert torch.neuron.memory_allocated() == base


def test_host_errors_are_the_devices_errors_through_the_c_path():
    f = facts(aten.mm.default)
    a, b = torch.randn(2, 3).to("neuron"), torch.randn(4, 5).to("neuron")
    with pytest.raises(RuntimeError) as c_err:
        kernels.execute(f, (a, b), {})
    with pytest.raises(RuntimeError) as py_err:
        kernels.execute_py(f, (a, b), {})
    assert str(c_err.value) == str(py_err.value)


def test_the_dispatcher_reaches_execute_through_the_c_kernel(monkeypatch):
    seen = []
    real = kernels.execute

    def spy(f, args, kwargs):
        seen.append(f.name)
        return real(f, args, kwargs)
    from neuron_lab.device import runtime_interface
    monkeypatch.setattr(runtime_interface, "launch", spy)   # the kernel reads it at each call
    n = torch.randn(4).to("neuron")
    runtime_interface.run_directly(False)   # else the direct kernel runs sin (test_direct_kernel)
    try:
        y = torch.sin(n)
    finally:
        runtime_interface.run_directly(True)
    assert "aten::sin" in seen and torch.equal(y.cpu(), torch.sin(n.cpu()))
