"""Device tensors behave like a backend's: factories, transfers, views, errors (oracle: CPU)."""
import pytest
import torch

import neuron_lab

N = torch.device("neuron", 0)


@pytest.fixture(autouse=True)
def eager():
    with neuron_lab.mode("eager"):
        yield


def test_registration_and_accelerator():
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.neuron.is_available() and torch.neuron.device_count() == 1
    assert torch.neuron.current_device() == 0
    torch.accelerator.synchronize()
    torch.neuron.synchronize()
    assert torch.bfloat16 in torch.neuron.get_amp_supported_dtype()
    import importlib
    importlib.reload(neuron_lab)          # idempotent


@pytest.mark.parametrize("make", [
    lambda d: torch.zeros(3, 4, device=d), lambda d: torch.ones(5, device=d),
    lambda d: torch.full((2, 2), 7.0, device=d), lambda d: torch.arange(10, device=d),
    lambda d: torch.arange(0, 1, 0.25, device=d), lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
    lambda d: torch.zeros_like(torch.ones(3, device=d)), lambda d: torch.eye(3, device=d),
    lambda d: torch.linspace(0, 1, 5, device=d)])
def test_factories_match_cpu(make):
    t = make(N)
    assert t.device == N
    assert torch.equal(t.cpu(), make("cpu"))


def test_random_factories_follow_the_seed():
    for f in (lambda d: torch.randn(4, 4, device=d), lambda d: torch.rand(3, device=d),
              lambda d: torch.randint(0, 10, (6,), device=d)):
        torch.manual_seed(7)
        a = f(N)
        torch.manual_seed(7)
        assert torch.equal(a.cpu(), f("cpu"))


def test_transfers_repr_numpy_tolist_item():
    c = torch.randn(3, 4)
    n = c.to("neuron")
    assert torch.equal(c.to("neuron", non_blocking=True).cpu(), c)
    assert "device='neuron:0'" in repr(n)
    with pytest.raises(TypeError, match="can't convert neuron:0 device type tensor to numpy"):
        n.numpy()
    assert n.cpu().numpy().shape == (3, 4)
    assert n.tolist() == c.tolist()
    assert n.sum().item() == pytest.approx(c.sum().item())
    assert n.dtype == c.dtype and n.shape == c.shape


def test_views_inplace_version_counter():
    c = torch.arange(12.0).reshape(3, 4)
    n = c.to("neuron")
    vn, vc = n.t()[1:], c.t()[1:]
    assert vn.stride() == vc.stride() and vn.storage_offset() == vc.storage_offset()
    assert vn._base is n
    v0 = n._version
    vn.mul_(2)
    vc.mul_(2)
    assert n._version > v0
    assert torch.equal(n.cpu(), c)
    n[0, 0] = 100.0
    c[0, 0] = 100.0
    assert torch.equal(n.cpu(), c)
    assert torch.equal(n.view(-1)[3:7].cpu(), c.view(-1)[3:7])


def test_bad_device_index():
    with pytest.raises(RuntimeError, match="neuron:0"):
        torch.ones(2, device="neuron:3")


def test_mixing_devices_is_a_clear_error():
    with pytest.raises(RuntimeError, match="^Expected all tensors to be on the same device"):
        torch.ones(3, device="neuron") + torch.ones(3)
    # 0-dim CPU tensors act as scalars, as on CUDA
    assert torch.equal((torch.ones(3, device="neuron") + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))
