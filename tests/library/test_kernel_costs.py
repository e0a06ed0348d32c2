"""The cost model knows the library's kernels (issue 45, item 4).

FLOPs reach PyTorch's flop registry (so ``FlopCounterMode``, ``estimate()`` and the adaptive
runtime's region costing — what the side panel's per-cell modelled time is priced from — all
count them); bytes reach the cost model's ``KERNEL_COSTS`` hook (``op_cost``). FlashAttention's
modelled HBM traffic is compared with the unfused math path's.
"""
import importlib

import torch
from torch.utils.flop_counter import FlopCounterMode

import neuron_lab
from neuron_lab.library import flash_attention, kernel_costs, moe
from neuron_lab.runtime import knobs
from neuron_lab.telemetry.costing import region_cost

cost_model = importlib.import_module("neuron_lab.telemetry.cost_model")   # (the package's
                                                                          # name is the function)

OPS = torch.ops.neuron_lab


def qkv(t=256, h=4, hkv=2, d=32):
    return (torch.randn(1, h, t, d).to("neuron"), torch.randn(1, hkv, t, d).to("neuron"),
            torch.randn(1, hkv, t, d).to("neuron"))


def test_flop_formulas_are_pytorchs_for_attention_and_skip_masked_tiles(eager):
    q, k, v = qkv(t=512, h=4, hkv=4)
    with FlopCounterMode(display=False) as full:
        flash_attention(q, k, v)
    assert full.get_total_flops() == 4 * 4 * 512 * 512 * 32        # sdpa's own formula
    with FlopCounterMode(display=False) as causal:
        flash_attention(q, k, v, causal=True)
    tiles = 4 * 5 // 2                                                 # 128-row tiles, lower half
    assert causal.get_total_flops() == 4 * 4 * 32 * 128 * 128 * tiles
    with FlopCounterMode(display=False) as window:
        flash_attention(q, k, v, causal=True, window=64)
    assert window.get_total_flops() < causal.get_total_flops()


def test_op_cost_counts_the_key_value_rereads_of_the_tiles(eager):
    """Bytes from the hook: every query tile reads the key/value tiles it sees, so the kernel
    moves more than its inputs and outputs once, and less than T × S scores would."""
    assert cost_model.KERNEL_COSTS, "the byte hook is not connected"
    q, k, v = qkv(t=512)
    args = (q, k, v, None, None, None, 0.1, True, -1, 0.0, 128, 128)
    out = OPS.flash_attention_fwd(*args)
    c = cost_model.op_cost(OPS.flash_attention_fwd.default, args, {}, out)
    io = sum(t.numel() * t.element_size() for t in (q, k, v, *out))
    assert io < c.bytes < 4 * 512 * 512 * 4
    assert c.flops == kernel_costs.flash_forward_cost(
        dict(q=q, k=k, v=v, causal=True, window=-1, block_q=128, block_k=128))[1]


def test_estimate_prices_the_kernel_and_the_unfused_path(eager):
    q, k, v = qkv(t=512, h=8, hkv=8)
    flash = neuron_lab.estimate(lambda: flash_attention(q, k, v, causal=True))["eager"]
    math_path = neuron_lab.estimate(lambda: torch.ops.aten._scaled_dot_product_attention_math(
        q, k, v, is_causal=True)[0])["eager"]
    assert flash["launches"] == 1 and math_path["launches"] > 5
    assert flash["bytes"] * 5 < math_path["bytes"]
    assert flash["modelled_s"] < math_path["modelled_s"]


def test_region_cost_in_adaptive_mode_counts_the_kernel_flops():
    """Adaptive mode learns a region holding the kernel; its modelled cost (what the side panel
    prices a cell's launches with) carries the kernel's FLOPs."""
    neuron_lab.runtime.reset()
    q, k, v = qkv(t=256)
    with knobs.COMPILE.scoped(False), neuron_lab.mode("adaptive"):
        for _ in range(3):
            (flash_attention(q * 1, k, v, causal=True) + 1).cpu()
    regions = [r for r in neuron_lab.runtime.current().regions()
               if any("flash_attention_fwd" in str(n) for n in r.names)]
    assert regions
    flops = kernel_costs.flash_forward_cost(
        dict(q=q, k=k, v=v, causal=True, window=-1, block_q=128, block_k=128))[1]
    assert region_cost(regions[0]).fused.flops >= flops
    neuron_lab.runtime.reset()


def test_flash_attention_moves_far_less_hbm_than_the_unfused_path():
    """T = 4096, 8 heads, D 64, bf16, causal, forward + backward: modelled, not measured."""
    trn2 = kernel_costs.compare_attention(1, 8, 4096, 64, chip="trn2")
    trn3 = kernel_costs.compare_attention(1, 8, 4096, 64, chip="trn3")
    assert trn2["hbm_ratio"] > 5 and trn2["speedup"] > 3
    assert trn2["flash"]["launches"] == 2 and trn2["unfused"]["launches"] > 8
    assert trn3["flash"]["modelled_s"] < trn2["flash"]["modelled_s"]       # more HBM bandwidth


def test_moe_kernels_are_priced_by_the_rows_they_keep(eager):
    x, w = torch.randn(12, 8).to("neuron"), torch.randn(3, 6, 8).to("neuron")
    ids = torch.tensor([[0], [0], [0], [1], [1], [2], [0], [1], [0], [0], [2], [0]]).to("neuron")
    p = moe.permute(x, ids, 3, capacity=2)
    c = cost_model.op_cost(OPS.grouped_gemm.default, (p.rows, w, p.offsets), {}, None)
    assert c.flops == 2 * 6 * 6 * 8                  # 6 kept rows of 12, each 6 x 8
    with FlopCounterMode(display=False) as fc:
        moe.grouped_gemm(p.rows, w, p.offsets)
    assert fc.get_total_flops() == c.flops


def test_flop_counter_covers_every_stage_forward_and_backward(eager):
    """``FlopCounterMode`` over a routed experts MLP and attention, forward and backward: every
    kernel has a formula (none raises), and the GEMMs' 2·M·N·K dominate as they should."""
    x = torch.randn(10, 8).to("neuron").requires_grad_()
    logits = torch.randn(10, 4).to("neuron").requires_grad_()
    w1 = torch.randn(4, 12, 8).to("neuron").requires_grad_()
    w2 = torch.randn(4, 8, 6).to("neuron").requires_grad_()
    q, k, v = (t.requires_grad_() for t in qkv(t=64))
    with FlopCounterMode(display=False) as fc:
        weights, ids = moe.route(logits, 2)
        out, _ = moe.experts_mlp(x, ids, weights, w1, w2)
        (out.sum() + flash_attention(q, k, v, causal=True).sum()).backward()
    counts = {str(op): n for op, n in fc.get_flop_counts()["Global"].items()}
    gemm = 2 * 20 * (12 * 8 + 8 * 6)
    assert counts["neuron_lab.grouped_gemm"] == gemm
    assert counts["neuron_lab.grouped_gemm_bwd"] == 2 * gemm
    for name in ("moe_route", "moe_route_bwd", "moe_permute", "moe_permute_bwd",
                 "moe_unpermute", "moe_unpermute_bwd", "flash_attention_fwd",
                 "flash_attention_bwd"):
        assert counts.get(f"neuron_lab.{name}", 0) > 0, (name, counts)
