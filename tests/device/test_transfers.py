"""Moving data on and off ``neuron`` behaves as on CUDA: ``.to``, ``.cpu``, numpy, repr, host reads."""
import pytest
import torch
from torch import nn

N = torch.device("neuron", 0)


def test_to_and_back_is_exact(any_mode):
    c = torch.randn(3, 4)
    for dev in ("neuron", "neuron:0", N, torch.device("neuron")):
        n = c.to(dev)
        assert n.device == N and n.dtype == c.dtype and n.shape == c.shape
        assert torch.equal(n.cpu(), c) and torch.equal(n.to("cpu"), c)
    assert c.to("neuron").is_contiguous()


def test_non_blocking_and_pinned(any_mode):
    c = torch.randn(64)
    n = c.to("neuron", non_blocking=True)
    assert torch.equal(n.cpu(), c)
    back = n.to("cpu", non_blocking=True)
    torch.neuron.synchronize()
    assert torch.equal(back, c)


def test_to_with_dtype_and_copy_semantics(any_mode):
    c = torch.arange(6.0).reshape(2, 3)
    n = c.to("neuron", torch.bfloat16)
    assert n.dtype == torch.bfloat16 and torch.equal(n.cpu(), c.to(torch.bfloat16))
    n32 = c.to("neuron")
    assert n32.to("neuron") is n32                      # no-op, as on CUDA
    assert n32.to("neuron", copy=True) is not n32
    assert n32.float() is n32


def test_noncontiguous_source_and_copy_between_devices(any_mode):
    c = torch.arange(24.0).reshape(4, 6)[:, ::2].t()
    n = c.to("neuron")
    assert torch.equal(n.cpu(), c)
    dst = torch.zeros(3, 4, device="neuron")
    dst.copy_(c)                                         # host -> device into an existing tensor
    assert torch.equal(dst.cpu(), c)
    out = torch.empty(3, 4)
    out.copy_(n)                                         # device -> host into an existing tensor
    assert torch.equal(out, c)
    v = torch.zeros(4, 6, device="neuron")
    v[:, 1::2].copy_(c.t())                              # into a strided device view
    ref = torch.zeros(4, 6)
    ref[:, 1::2] = c.t()
    assert torch.equal(v.cpu(), ref)


def test_numpy_raises_like_cuda():
    n = torch.ones(2, device="neuron")
    with pytest.raises(TypeError, match=r"can't convert neuron:0 device type tensor to numpy"):
        n.numpy()
    assert (n.cpu().numpy() == 1).all()


def test_repr_shows_the_device(any_mode):
    n = torch.tensor([1.0, 2.0], device="neuron")
    assert repr(n) == "tensor([1., 2.], device='neuron:0')"
    assert "device='neuron:0'" in repr(torch.zeros(2, 2, dtype=torch.int8, device="neuron"))
    assert "grad_fn" in repr(torch.ones(2, device="neuron", requires_grad=True) * 2)
    assert str(n) == repr(n)


def test_host_reads(any_mode):
    c = torch.randn(2, 3)
    n = c.to("neuron")
    assert n.tolist() == c.tolist()
    assert n[1, 2].item() == c[1, 2].item()
    assert n.sum().item() == c.sum().item()
    assert torch.tensor(5, device="neuron").item() == 5
    assert bool(torch.tensor(True, device="neuron")) and not bool(torch.zeros((), device="neuron"))
    assert int(torch.tensor(7, device="neuron")) == 7 and float(n[0, 0]) == float(c[0, 0])
    if torch.tensor(1.0, device="neuron") > 0:            # data-dependent control flow
        pass


def test_module_to_and_back(any_mode):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    ref = {k: v.clone() for k, v in m.state_dict().items()}
    m.to("neuron")
    assert all(v.device == N for v in m.state_dict().values())
    assert all(p.device == N and isinstance(p, nn.Parameter) for p in m.parameters())
    m.cpu()
    assert all(torch.equal(v, ref[k]) for k, v in m.state_dict().items())
    m.to(device="neuron", dtype=torch.bfloat16)
    assert next(m.parameters()).dtype == torch.bfloat16
