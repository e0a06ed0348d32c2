"""Bad input gets a clear error, shaped like CUDA's where CUDA has one.

Mixing devices: "Expected all tensors to be on the same device, but found at least two
devices, ..." (CUDA's wording) plus how to fix it; 0-dim CPU tensors act as scalars and CPU
index tensors are accepted for indexing, as on CUDA. Wrong device index: names the one device.
"""
import pytest
import torch
from torch import nn

from neuron_lab.device import config

SAME_DEVICE = r"^Expected all tensors to be on the same device, but found at least two devices"


def n(*shape):
    return torch.ones(*shape, device="neuron")


MIXED = {
    "add": lambda: n(3) + torch.ones(3), "radd": lambda: torch.ones(3) + n(3),
    "mul_": lambda: n(3).mul_(torch.ones(3)), "mm": lambda: n(2, 2) @ torch.ones(2, 2),
    "cat": lambda: torch.cat([n(2), torch.ones(2)]), "where": lambda: torch.where(
        n(2) > 0, n(2), torch.ones(2)),
    "index_select": lambda: n(4).index_select(0, torch.tensor([0])),
    "linear": lambda: nn.Linear(2, 2).to("neuron")(torch.ones(1, 2)),
    "addcmul": lambda: torch.addcmul(n(2), torch.ones(2), n(2)),
}


@pytest.mark.parametrize("name", sorted(MIXED))
def test_mixing_devices_is_a_clear_error(name, any_mode):
    with pytest.raises(RuntimeError, match=SAME_DEVICE) as e:
        MIXED[name]()
    msg = str(e.value)
    assert "neuron:0" in msg and "cpu" in msg and ".to('neuron')" in msg


def test_what_cuda_allows_is_allowed(any_mode):
    x = torch.arange(4.0, device="neuron")
    assert torch.equal((x + torch.tensor(2.0)).cpu(), torch.arange(4.0) + 2)     # 0-dim CPU
    assert torch.equal(x[torch.tensor([3, 0])].cpu(), torch.tensor([3.0, 0.0]))  # CPU index
    x[torch.tensor([1])] = 9.0
    assert x[1].item() == 9.0
    dst = n(3)
    dst.copy_(torch.zeros(3))                                                     # a transfer
    assert dst.sum().item() == 0


@pytest.mark.parametrize("out", [lambda: torch.zeros(3), lambda: torch.zeros(())],
                         ids=["1d", "0d"])
def test_out_on_the_host_is_refused_and_left_unwritten(out, any_mode):
    """``torch.add(n, n, out=cpu_tensor)`` raises as on CUDA (it used to write the CPU tensor);
    a 0-dim CPU tensor is a scalar *input*, never an output."""
    o = out()
    with pytest.raises(RuntimeError, match=SAME_DEVICE) as e:
        torch.add(n(3), n(3), out=o)
    assert "aten::add.out" in str(e.value) and torch.count_nonzero(o) == 0
    vals, idx = torch.zeros(2), torch.zeros(2, dtype=torch.long)
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        torch.max(n(2, 3), 1, out=(vals, idx))
    assert torch.count_nonzero(vals) == 0
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        torch.zeros(()).add_(n(3).sum())
    into = n(3)
    torch.add(n(3), n(3), out=into)                               # neuron out= still works
    assert torch.equal(into.cpu(), torch.full((3,), 2.0))


@pytest.mark.parametrize("call", [
    lambda: torch.ones(2, device="neuron:3"), lambda: torch.ones(2).to("neuron:1"),
    lambda: torch.ones(2).to(torch.device("neuron", 2)), lambda: n(2).to("neuron:5"),
    lambda: torch.neuron.set_device(3), lambda: torch.zeros(2, device="neuron:1").sum()])
def test_wrong_device_index(call):
    with pytest.raises(RuntimeError) as e:
        call()
    msg = str(e.value)
    assert "neuron:0" in msg and ("1 neuron device" in msg or "invalid device" in msg), msg


def test_unsupported_dtype_under_error_policy_is_clear(any_mode):
    with config.FALLBACK.scoped("error"):
        with pytest.raises(RuntimeError) as e:
            n(2).to(torch.float64)
    msg = str(e.value)
    assert "float64" in msg and "neuron:0" in msg and "Trainium" in msg and "Fix:" in msg


def test_numpy_and_data_ptr_behave_like_an_accelerator():
    with pytest.raises(TypeError, match="neuron:0 device type tensor to numpy.*Tensor.cpu"):
        n(2).numpy()
    assert n(2).data_ptr() != 0             # an address, as on any device (test_storage_address)
    with pytest.raises(RuntimeError):
        n(2).pin_memory()                   # only CPU tensors can be pinned


def test_foreign_tensor_without_device_data_is_explained():
    t = torch._C._acc.create_empty_tensor((3,), torch.float32)   # a neuron tensor nobody filled
    with pytest.raises(RuntimeError, match="has no device data"):
        t + 1
