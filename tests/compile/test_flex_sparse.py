"""Sparse masks skip work (issue 43, item 4): on ``neuron`` the FlexAttention kernel computes
only the blocks a ``BlockMask`` lists (``neuron_lab.compile.flex_attention.stats()`` counts
them), and the cost model prices the kernel from the blocks computed.

Shapes: B=1, H=2, L=S=256, 32-wide blocks: an 8 x 8 block grid per head (128 block pairs).
Sliding window (64 tokens, causal) computes 42 of 128 block pairs, a document mask of four
64-token documents 32 of 128 — exactly the blocks the masks list (query blocks are grouped by
their kv block count, so no padding is computed here); results equal
the CPU eager reference (rtol/atol 1e-5). The cost model's FLOPs for the kernel scale by the
same fraction, and its bytes and modelled seconds drop."""
import math

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import neuron_lab
from neuron_lab.compile import flex_attention as nflex
from neuron_lab.telemetry import costing
from neuron_lab.telemetry.cost_model import cost_model

H, L, E, BS = 2, 256, 16, 32
_doc = torch.arange(L) // 64

MASKS = {
    "dense": lambda b, h, q, kv: q >= 0,
    "sliding_window": lambda b, h, q, kv: (q >= kv) & (q - kv < 64),
    "document": lambda b, h, q, kv: _doc.to(q.device)[q] == _doc.to(q.device)[kv],
}


def _qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, H, L, E, generator=g) for _ in range(3)]


def _run(mask, dev="neuron"):
    mask_mod = MASKS[mask]
    if mask == "document":
        doc = _doc.to(dev)
        mask_mod = lambda b, h, q, kv: doc[q] == doc[kv]          # noqa: E731
    bm = create_block_mask(mask_mod, 1, 1, L, L, device=dev, BLOCK_SIZE=BS)
    q, k, v = (t.to(dev) for t in _qkv())
    nflex.reset_stats()
    out = flex_attention(q, k, v, block_mask=bm)
    neuron_lab.sync()
    return out, nflex.stats()


# per head: sliding window 1 + 2 + 6 * 3 = 21 of 64; documents (not causal) 8 * 2 = 16 of 64
@pytest.mark.parametrize("mask,computed", [("sliding_window", 2 * 21), ("document", 2 * 16)])
def test_sparse_masks_compute_fewer_blocks(mask, computed):
    out, st = _run(mask)
    assert st["blocks_total"] == 2 * 8 * 8
    assert st["blocks_computed"] == computed, st
    assert st["blocks_needed"] == st["blocks_computed"]          # no padding left here
    # the skipped blocks were masked anyway: same result as the dense math
    ref_mask = create_block_mask(MASKS[mask], 1, 1, L, L, device="cpu", BLOCK_SIZE=BS)
    ref = flex_attention(*_qkv(), block_mask=ref_mask)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)


def _kernel_costs() -> list:
    """The cost model's (seconds, Cost) of the flex kernel in each adaptive region holding it."""
    from neuron_lab import runtime
    costing.clear()
    model = cost_model()
    found = []
    for r in runtime.current().regions():
        for (op, _), c in zip(r.keys, costing.region_cost(r).per_op):
            name = getattr(getattr(getattr(op, "op", op), "_schema", None), "name", "")
            if name == "neuron_lab::flex_fwd":
                found.append((model.launch_s(c), c))
    return found


def test_cost_model_reflects_skipped_blocks():
    with neuron_lab.mode("adaptive"):
        for mask in ("dense", "sliding_window"):
            for _ in range(3):                  # recognised as a region, priced as one
                _run(mask)
    costs = _kernel_costs()
    dense = max(costs, key=lambda sc: sc[1].flops)
    assert math.isclose(dense[1].flops, 2.0 * H * L * L * 2 * E, rel_tol=1e-6), costs
    # FLOPs scale with the blocks computed: the sliding window's 42 of 128
    sparse = [sc for sc in costs if math.isclose(sc[1].flops, dense[1].flops * 42 / 128)]
    assert sparse, costs
    assert sparse[0][0] < dense[0] and sparse[0][1].bytes < dense[1].bytes
