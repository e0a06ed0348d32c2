"""Factory functions with ``device='neuron'`` equal their CPU result (values, dtype, shape, strides).

Oracle: the same call with ``device='cpu'``. Random factories are compared after the same
``torch.manual_seed``: the device draws from the host generator, so the values are CPU's.
"""
import numpy as np
import pytest
import torch

N = torch.device("neuron", 0)

FACTORIES = {
    "empty_shape": lambda d: torch.empty(3, 4, device=d).shape,
    "zeros": lambda d: torch.zeros(3, 4, device=d),
    "zeros_int": lambda d: torch.zeros(5, dtype=torch.int64, device=d),
    "ones": lambda d: torch.ones(5, device=d),
    "ones_bf16": lambda d: torch.ones(2, 3, dtype=torch.bfloat16, device=d),
    "full": lambda d: torch.full((2, 2), 7.5, device=d),
    "full_bool": lambda d: torch.full((3,), True, device=d),
    "arange": lambda d: torch.arange(10, device=d),
    "arange_float": lambda d: torch.arange(0, 1, 0.125, device=d),
    "arange_dtype": lambda d: torch.arange(2, 20, 3, dtype=torch.int32, device=d),
    "linspace": lambda d: torch.linspace(-1, 1, 7, device=d),
    "eye": lambda d: torch.eye(3, 4, device=d),
    "tensor_list": lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
    "tensor_float": lambda d: torch.tensor([1.5, -2.0], dtype=torch.float16, device=d),
    "tensor_scalar": lambda d: torch.tensor(3.25, device=d),
    "tensor_numpy": lambda d: torch.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=d),
    "as_tensor": lambda d: torch.as_tensor([1, 2, 3], device=d),
    "empty_strided_shape": lambda d: torch.empty_strided((2, 3), (1, 2), device=d).stride(),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factory_equals_cpu(name, any_mode):
    make = FACTORIES[name]
    got, want = make(N), make("cpu")
    if isinstance(want, torch.Tensor):
        assert got.device == N
        assert got.dtype == want.dtype and got.stride() == want.stride()
        assert torch.equal(got.cpu(), want)
    else:
        assert got == want


LIKE = {
    "zeros_like": torch.zeros_like, "ones_like": torch.ones_like,
    "full_like": lambda t: torch.full_like(t, 2.5), "empty_like": lambda t: torch.empty_like(t),
    "rand_like": torch.rand_like, "randn_like": torch.randn_like,
    "randint_like": lambda t: torch.randint_like(t, 0, 9),
}


@pytest.mark.parametrize("name", sorted(LIKE))
def test_like_factories_keep_device_dtype_layout(name, any_mode):
    base_cpu = torch.randn(4, 6).t()            # non-contiguous: *_like preserves strides
    base = base_cpu.to("neuron")
    torch.manual_seed(3)
    got = LIKE[name](base)
    torch.manual_seed(3)
    want = LIKE[name](base_cpu)
    assert got.device == N and got.dtype == want.dtype
    assert got.shape == want.shape and got.stride() == want.stride()
    if name != "empty_like":
        assert torch.equal(got.cpu(), want)


def test_new_factories_follow_the_tensor():
    x = torch.ones(2, dtype=torch.float16, device="neuron")
    for t in (x.new_zeros(3), x.new_ones(3), x.new_full((3,), 4.0), x.new_empty(3),
              x.new_tensor([1.0, 2.0])):
        assert t.device == N and t.dtype == torch.float16


@pytest.mark.parametrize("make", [
    lambda d: torch.randn(4, 5, device=d), lambda d: torch.rand(3, 2, device=d),
    lambda d: torch.randint(0, 10, (6,), device=d), lambda d: torch.randint(5, (2, 2), device=d),
    lambda d: torch.randperm(7, device=d), lambda d: torch.empty(5, device=d).normal_(2.0, 3.0),
    lambda d: torch.empty(5, device=d).uniform_(-1, 1), lambda d: torch.bernoulli(
        torch.full((8,), 0.5, device=d))])
def test_random_factories_follow_the_seed(make, any_mode):
    torch.manual_seed(7)
    got = make(N)
    torch.manual_seed(7)
    want = make("cpu")
    assert got.device == N and torch.equal(got.cpu(), want)


def test_default_device_context():
    with torch.device("neuron"):
        t = torch.ones(2)
    assert t.device == N
    torch.set_default_device("neuron")
    try:
        assert torch.zeros(1).device == N
    finally:
        torch.set_default_device(None)
    assert torch.zeros(1).device.type == "cpu"
