"""FlexAttention on ``neuron``, forward and backward, against PyTorch's eager math reference
on CPU (``math_attention`` differentiated by autograd): eager and adaptive mode (the device's
kernels behind the HOPs) and compiled (``torch.compile``, default backend: the kernels as
extern calls in the compiled program). Block masks made on ``neuron``, with ``_compile=True``
too.

Tolerances: float32 rtol 1e-5, atol 2e-5 (measured ~2e-6); bfloat16 atol 2e-2 (out) and 2 %
of the largest gradient (the reference rounds intermediates to bf16 in other places).
The default run covers one case per mode; ``-m slow`` the masks x score_mods x dtypes matrix."""
import itertools
import math
import warnings

import pytest
import torch
from torch._higher_order_ops.flex_attention import math_attention
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import neuron_lab
from neuron_lab.compile import flex_attention as nflex

B, HQ, HKV, L, E, BS = 2, 4, 2, 64, 16, 16


def _masks(dev):
    doc = torch.repeat_interleave(torch.arange(3), torch.tensor([20, 30, 14])).to(dev)
    return {
        "causal": lambda b, h, q, kv: q >= kv,
        "sliding_window": lambda b, h, q, kv: (q >= kv) & (q - kv <= 16),
        "document": lambda b, h, q, kv: doc[q] == doc[kv],
    }


def _score_mods(dev):
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]).to(dev)
    return {
        "none": None,
        "alibi": lambda s, b, h, q, kv: s + slopes[h] * (kv - q),
        "softcap": lambda s, b, h, q, kv: 30 * torch.tanh(s / 30),
    }


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HQ, L, E, generator=g).to(dtype)
    k = torch.randn(B, HKV, L, E, generator=g).to(dtype)
    v = torch.randn(B, HKV, L, E, generator=g).to(dtype)
    go = torch.randn(B, HQ, L, E, generator=g).to(dtype)
    return q, k, v, go


def _reference(q, k, v, go, mask, score):
    mask_mod, score_mod = _masks("cpu")[mask], _score_mods("cpu")[score]
    bm = create_block_mask(mask_mod, B, 1, L, L, device="cpu", BLOCK_SIZE=BS)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out, _, _ = math_attention(q, k, v, score_mod or (lambda s, b, h, i, j: s), bm.as_tuple(),
                               1 / math.sqrt(E), {})
    return out.detach(), torch.autograd.grad(out, (q, k, v), go)


def _on_neuron(q, k, v, go, mask, score, fn=flex_attention, compile_mask=False):
    mask_mod, score_mod = _masks("neuron")[mask], _score_mods("neuron")[score]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        bm = create_block_mask(mask_mod, B, 1, L, L, device="neuron", BLOCK_SIZE=BS,
                               _compile=compile_mask)
    qn, kn, vn = (t.to("neuron").requires_grad_() for t in (q, k, v))
    out = fn(qn, kn, vn, score_mod=score_mod, block_mask=bm, enable_gqa=True)
    out.backward(go.to("neuron"))
    return out.detach().cpu(), [t.grad.cpu() for t in (qn, kn, vn)]


def _assert_close(got, ref, dtype):
    (out, grads), (rout, rgrads) = got, ref
    if dtype == torch.float32:
        torch.testing.assert_close(out, rout, rtol=1e-5, atol=2e-5)
        for a, r in zip(grads, rgrads):
            torch.testing.assert_close(a, r, rtol=1e-5, atol=2e-5)
    else:
        torch.testing.assert_close(out.float(), rout.float(), rtol=0, atol=2e-2)
        for a, r in zip(grads, rgrads):
            torch.testing.assert_close(a.float(), r.float(), rtol=0,
                                       atol=2e-2 * r.float().abs().max().item())


def _case(mode, mask, score, dtype, compiled=False, compile_mask=False):
    q, k, v, go = _inputs(dtype)
    ref = _reference(q, k, v, go, mask, score)
    nflex.reset_stats()
    with neuron_lab.mode(mode):
        fn = torch.compile(flex_attention) if compiled else flex_attention
        got = _on_neuron(q, k, v, go, mask, score, fn=fn, compile_mask=compile_mask)
        neuron_lab.sync()
    _assert_close(got, ref, dtype)
    st = nflex.stats()
    assert st["launches"] >= 1 and st["backward_launches"] >= 1, st


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
def test_flex_forward_backward_uncompiled(mode):
    _case(mode, "document", "alibi", torch.float32)


def test_flex_bf16_sliding_window_softcap():
    _case("adaptive", "sliding_window", "softcap", torch.bfloat16)


def test_flex_compiled_forward_backward_with_compiled_block_mask():
    """torch.compile's default backend; the block mask built with ``_compile=True`` on neuron
    equals the one built eagerly on CPU."""
    _case("adaptive", "causal", "alibi", torch.float32, compiled=True, compile_mask=True)
    mask_mod = _masks("neuron")["causal"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        a = create_block_mask(mask_mod, B, 1, L, L, device="neuron", BLOCK_SIZE=BS,
                              _compile=True)
    b = create_block_mask(_masks("cpu")["causal"], B, 1, L, L, device="cpu", BLOCK_SIZE=BS)
    assert a.kv_num_blocks.device.type == "neuron"
    for x, y in zip(a.as_tuple()[2:10], b.as_tuple()[2:10]):
        torch.testing.assert_close(x.cpu(), y)


_MATRIX = list(itertools.product(("causal", "sliding_window", "document"),
                                 ("none", "alibi", "softcap")))


@pytest.mark.slow
@pytest.mark.parametrize("mode,mask,score,dtype", [
    (m, mask, score, dt) for m in ("eager", "adaptive") for mask, score in _MATRIX
    for dt in (torch.float32, torch.bfloat16)])
def test_flex_uncompiled_matrix(mode, mask, score, dtype):
    _case(mode, mask, score, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("mask,score,dtype", [(mask, score, torch.float32)
                                              for mask, score in _MATRIX]
                         + [("document", "softcap", torch.bfloat16)])
def test_flex_compiled_matrix(mask, score, dtype):
    _case("adaptive", mask, score, dtype, compiled=True)
