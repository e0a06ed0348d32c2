"""The device's FlexAttention kernel (``compile/flex_kernel.py``) on host tensors against
PyTorch's eager math reference on CPU (``math_attention``, differentiated by autograd).

Tolerances: float32 forward, lse and gradients rtol 1e-5, atol 2e-5 (measured max abs error
~2e-6: the same math, summed over gathered blocks); bfloat16 atol 2e-2 relative to the
largest gradient (the reference rounds its intermediate products to bf16 differently).
The default run keeps one case per mask and score_mod; ``-m slow`` runs the full matrix."""
import itertools
import math

import pytest
import torch
from torch._higher_order_ops.flex_attention import math_attention
from torch.nn.attention.flex_attention import create_block_mask

from neuron_lab.compile import flex_kernel

L = 100          # not a multiple of the block size: the last block is partial
BS = 16
_doc = torch.repeat_interleave(torch.arange(4), torch.tensor([30, 20, 40, 10]))
_slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])

MASKS = {
    "causal": lambda b, h, q, kv: q >= kv,
    "sliding_window": lambda b, h, q, kv: (q >= kv) & (q - kv <= 20),
    "document": lambda b, h, q, kv: _doc[q] == _doc[kv],
}
SCORE_MODS = {
    "none": lambda s, b, h, q, kv: s,
    "alibi": lambda s, b, h, q, kv: s + _slopes[h] * (kv - q),
    "softcap": lambda s, b, h, q, kv: 20 * torch.tanh(s / 20),
}


def _check(mask, score, dtype=torch.float32, hq=4, hkv=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    B, E = 2, 16
    mask_mod, score_mod = MASKS[mask], SCORE_MODS[score]
    bm = create_block_mask(mask_mod, B, 1, L, L, device="cpu", BLOCK_SIZE=BS)
    q = torch.randn(B, hq, L, E, generator=g).to(dtype).requires_grad_()
    k = torch.randn(B, hkv, L, E, generator=g).to(dtype).requires_grad_()
    v = torch.randn(B, hkv, L, E, generator=g).to(dtype).requires_grad_()
    scale = 1 / math.sqrt(E)
    ref_out, ref_lse, _ = math_attention(q, k, v, score_mod, bm.as_tuple(), scale, {})
    go = torch.randn(ref_out.shape, generator=g).to(dtype)
    ref = torch.autograd.grad(ref_out, (q, k, v), go)
    bl = flex_kernel.Blocks(bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks,
                            bm.full_kv_indices, *bm.BLOCK_SIZE)
    out, lse, _ = flex_kernel.forward(q.detach(), k.detach(), v.detach(), bl, score_mod,
                                      mask_mod, scale)
    grads = flex_kernel.backward(q.detach(), k.detach(), v.detach(), go, None, bl, score_mod,
                                 mask_mod, scale)[:3]
    if dtype == torch.float32:
        tol = dict(rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(out, ref_out, **tol)
        torch.testing.assert_close(lse, ref_lse, **tol)
        for a, r in zip(grads, ref):
            torch.testing.assert_close(a, r, **tol)
    else:
        torch.testing.assert_close(out.float(), ref_out.float(), rtol=0, atol=2e-2)
        for a, r in zip(grads, ref):
            torch.testing.assert_close(a.float(), r.float(), rtol=0,
                                       atol=2e-2 * r.float().abs().max().item())
    return flex_kernel.last_launch()


@pytest.mark.parametrize("mask,score", [("causal", "none"), ("sliding_window", "softcap"),
                                        ("document", "alibi")])
def test_kernel_matches_math_reference(mask, score):
    _check(mask, score)


def test_kernel_bf16_gqa():
    _check("causal", "alibi", dtype=torch.bfloat16, hq=4, hkv=1)


def test_sparse_masks_skip_blocks():
    n = -(-L // BS)
    dense = 2 * 4 * n * n
    sw = _check("sliding_window", "none")
    doc = _check("document", "none")
    assert sw.total == doc.total == dense
    assert sw.computed < dense / 2, sw
    assert sw.computed == sw.needed, sw         # query blocks grouped by kv block count
    assert doc.computed < dense, doc
    assert sw.needed <= sw.computed and doc.needed <= doc.computed


@pytest.mark.slow
@pytest.mark.parametrize("mask,score,dtype,hkv", list(itertools.product(
    MASKS, SCORE_MODS, (torch.float32, torch.bfloat16), (4, 1))))
def test_kernel_full_matrix(mask, score, dtype, hkv):
    _check(mask, score, dtype=dtype, hkv=hkv)
