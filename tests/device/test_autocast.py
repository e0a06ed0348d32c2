"""``torch.autocast('neuron', dtype=torch.bfloat16)`` equals ``torch.autocast('cpu', ...)``.

Both policies run matmuls and convolutions in bfloat16, so an MLP step under autocast must agree
with CPU autocast bitwise: outputs, loss, and the float32 gradients that flow back through the
casts. Disabling autocast inside the region runs float32 again. Beyond matmuls neuron follows
CUDA's op lists (``ATen/autocast_mode.h``, what a C++ PrivateUse1 backend registers): softmax,
norms and losses run in float32 (CPU's lists keep softmax/log_softmax/layer_norm in bfloat16).
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


def test_float32_ops_follow_cuda_autocast_lists(any_mode):
    """A loss, softmax or norm computed under autocast was bfloat16 on neuron (the device only
    had the lower-precision list): a model's loss and its GradScaler step differed from CUDA's."""
    x = torch.randn(4, 6).bfloat16().to("neuron")
    w = torch.randn(6).to("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert x.softmax(-1).dtype == torch.float32                       # fp32_set_opt_dtype
        assert torch.log_softmax(x, -1).dtype == torch.float32
        assert x.sum().dtype == torch.float32
        assert nn.functional.layer_norm(x, (6,)).dtype == torch.float32   # fp32
        assert nn.functional.mse_loss(x, x.float()).dtype == torch.float32
        assert x.exp().dtype == torch.float32
        assert torch.addcmul(x, x, w).dtype == torch.float32              # promote
        assert x.relu().dtype == torch.bfloat16                           # not listed: follows input
        assert x.to(torch.int64).sum().dtype == torch.int64               # not floating: unchanged
        assert x.softmax(-1, dtype=torch.bfloat16).dtype == torch.bfloat16   # explicit dtype kept
        ref = torch.log_softmax(x.cpu().float(), -1)
        assert torch.equal(torch.log_softmax(x, -1).cpu(), ref)
