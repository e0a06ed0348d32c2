"""``torch.autocast('neuron', dtype=torch.bfloat16)`` equals ``torch.autocast('cpu', ...)``.

Both policies run matmuls and convolutions in bfloat16 and let elementwise ops follow their
inputs, so an MLP step under autocast must agree with CPU autocast bitwise: outputs, loss, and
the float32 gradients that flow back through the casts. Disabling autocast inside the region runs
float32 again.
"""
import torch
from torch import nn


def _step(dev, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3)).to(dev)
    x, y = torch.randn(4, 10).to(dev), torch.randint(0, 3, (4,)).to(dev)
    img, k = torch.randn(1, 2, 5, 5).to(dev), torch.randn(3, 2, 3, 3).to(dev)
    with torch.autocast(dev, dtype=torch.bfloat16):
        assert torch.is_autocast_enabled(dev)
        out = model(x)
        conv = nn.functional.conv2d(img, k)
        with torch.autocast(dev, enabled=False):
            plain = model[0](x)
    loss = nn.functional.cross_entropy(out.float(), y)
    loss.backward()
    return [out, conv, plain, loss] + [p.grad for p in model.parameters()]


def test_autocast_step_equals_cpu_autocast(any_mode):
    cpu, dev = _step("cpu"), _step("neuron")
    assert [t.dtype for t in dev[:3]] == [torch.bfloat16, torch.bfloat16, torch.float32]
    assert all(g.dtype == torch.float32 for g in dev[4:])
    for a, b in zip(cpu, dev):
        assert b.device.type == "neuron" and a.dtype == b.dtype
        assert torch.equal(a, b.cpu())


def test_autocast_state_is_per_device():
    assert torch.amp.is_autocast_available("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("neuron") and not torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("neuron") == torch.bfloat16
        out = torch.ones(2, 2, device="neuron") @ torch.ones(2, 2, device="neuron")
        assert out.dtype == torch.bfloat16
        cpu_out = torch.ones(2, 2) @ torch.ones(2, 2)          # CPU autocast is off
        assert cpu_out.dtype == torch.float32
    assert not torch.is_autocast_enabled("neuron")
    assert (torch.ones(2, 2, device="neuron") @ torch.ones(2, 2, device="neuron")).dtype == \
        torch.float32
