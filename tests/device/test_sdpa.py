"""``scaled_dot_product_attention`` on neuron makes CPU's backend choice (registry._sdpa), so
results are CPU's bitwise; the choice is remembered by what it reads, including the process-wide
settings ``torch.nn.attention.sdpa_kernel`` changes."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import neuron_lab
from neuron_lab.device import executor

pytestmark = pytest.mark.skipif(executor.host_device().type != "cpu",
                                reason="CPU's choice is made on the CPU executor only")


def qkv(requires_grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, 16, 32, generator=g, requires_grad=requires_grad)
            for _ in range(3)]


def on_neuron(ts):
    return [t.detach().to("neuron").requires_grad_(t.requires_grad) for t in ts]


MASKS = {
    "causal": lambda: dict(is_causal=True),
    "bool mask": lambda: dict(attn_mask=torch.rand(16, 16, generator=torch.Generator()
                                                   .manual_seed(1)) > 0.3),
    "float mask": lambda: dict(attn_mask=torch.randn(16, 16, generator=torch.Generator()
                                                     .manual_seed(2))),
    "scale": lambda: dict(scale=0.3),
}


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
@pytest.mark.parametrize("kind", list(MASKS))
def test_outputs_and_gradients_are_cpus_bitwise(mode, kind):
    kw = MASKS[kind]()
    dkw = {k: v.to("neuron") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    q, k, v = qkv(requires_grad=True)
    want = F.scaled_dot_product_attention(q, k, v, **kw)
    want.square().sum().backward()
    with neuron_lab.mode(mode):
        for _ in range(3):                      # adaptive: recorded, then fused
            dq, dk, dv = on_neuron((q, k, v))
            got = F.scaled_dot_product_attention(dq, dk, dv, **dkw)
            got.square().sum().backward()
            assert torch.equal(got.detach().cpu(), want.detach())
            for d, c in ((dq, q), (dk, k), (dv, v)):
                assert torch.equal(d.grad.cpu(), c.grad)


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
def test_the_choice_follows_sdpa_kernel(mode):
    """The same shapes under ``sdpa_kernel(MATH)`` take the math path, as on the CPU, although
    the flash choice for them was made (and remembered) just before."""
    q, k, v = qkv()
    flash = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with sdpa_kernel(SDPBackend.MATH):
        math = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.equal(flash, math)         # the two kernels differ in the last bits
    dq, dk, dv = on_neuron((q, k, v))
    with neuron_lab.mode(mode):
        for _ in range(2):
            assert torch.equal(F.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
                               .cpu(), flash)
            with sdpa_kernel(SDPBackend.MATH):
                assert torch.equal(F.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
                                   .cpu(), math)


def test_an_ineligible_shape_takes_the_math_path_as_on_cpu():
    """A 3-d query is not flash's (CPU takes math): the same choice for the same shapes."""
    q, k, v = (t[0] for t in qkv())
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    dq, dk, dv = on_neuron((q, k, v))
    with neuron_lab.mode("eager"):
        assert torch.equal(F.scaled_dot_product_attention(dq, dk, dv, is_causal=True).cpu(), want)
