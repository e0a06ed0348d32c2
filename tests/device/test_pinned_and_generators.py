"""The PrivateUse1 hooks (csrc/hooks.cpp): pinned host memory, ``non_blocking`` copies and
``torch.Generator(device="neuron")``, which raised "You should register
`PrivateUse1HooksInterface` ... getPinnedMemoryAllocator" with the Python hooks."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import neuron_lab  # noqa: F401


def test_pin_memory_and_is_pinned():
    x = torch.arange(6.0)
    p = x.pin_memory()
    assert p.is_pinned() and not x.is_pinned() and torch.equal(p, x)
    assert p[2:].is_pinned()                      # inside a pinned block, as CUDA answers
    assert torch.empty(3, pin_memory=True).is_pinned()


def test_a_neuron_tensor_is_not_pinned_and_cannot_be():
    x = torch.ones(2, device="neuron")
    assert not x.is_pinned()
    with pytest.raises(RuntimeError, match="cannot pin a tensor on neuron:0.*x.pin_memory"):
        x.pin_memory()


def test_dataloader_pin_memory_then_non_blocking_copies(any_mode):
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(10, 3), torch.arange(10))
    seen = []
    for xb, yb in DataLoader(ds, batch_size=4, pin_memory=True):
        assert xb.is_pinned() and yb.is_pinned()
        xd = xb.to("neuron", non_blocking=True)
        yd = yb.to("neuron", non_blocking=True)
        seen.append((xd * 2).to("cpu", non_blocking=True))
        assert torch.equal(yd.cpu(), yb)
    torch.neuron.synchronize()
    assert torch.equal(torch.cat(seen), ds.tensors[0] * 2)


def test_device_generator_draws_what_the_host_generator_draws(any_mode):
    g = torch.Generator(device="neuron").manual_seed(7)
    assert g.device == torch.device("neuron", 0) and g.initial_seed() == 7
    c = torch.Generator().manual_seed(7)
    for draw in (lambda d, gen: torch.randn(5, device=d, generator=gen),
                 lambda d, gen: torch.rand(2, 3, device=d, generator=gen),
                 lambda d, gen: torch.randint(0, 9, (4,), device=d, generator=gen),
                 lambda d, gen: torch.randperm(6, device=d, generator=gen),
                 lambda d, gen: torch.empty(4, device=d).normal_(generator=gen),
                 lambda d, gen: torch.bernoulli(torch.full((6,), 0.5, device=d), generator=gen)):
        assert torch.equal(draw("neuron", g).cpu(), draw("cpu", c))


def test_device_generator_state_round_trip(any_mode):
    g = torch.Generator(device="neuron").manual_seed(3)
    state = g.get_state()
    a = torch.randn(4, device="neuron", generator=g)
    g.set_state(state)
    assert torch.equal(torch.randn(4, device="neuron", generator=g).cpu(), a.cpu())
    assert g.clone_state().device.type == "neuron"


def test_default_generator_follows_manual_seed(any_mode):
    torch.manual_seed(11)
    a = torch.randn(4, device="neuron")
    torch.manual_seed(11)
    assert torch.equal(a.cpu(), torch.randn(4))


def test_a_cpu_generator_for_a_neuron_op_is_refused_as_cuda_refuses_it():
    with pytest.raises(RuntimeError, match="Expected a 'neuron' device type for generator.*"
                                           "torch.Generator\\(device='neuron'\\)"):
        torch.randn(3, device="neuron", generator=torch.Generator())
