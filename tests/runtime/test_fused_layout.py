"""A fused program's outputs keep eager's layout, and a compile started inside a device kernel
works: two failures found on a Transformers Llama with grouped-query attention and its KV cache.

``DynamicCache.update`` concatenates an empty cache with the new keys, which arrive transposed
(``k_proj(x).view(B, T, H, D).transpose(1, 2)``). Eager's ``cat`` returns a contiguous tensor;
inductor returned one with the key's strides. The pending shell had eager's strides, so the next
region's program, compiled with a contiguous example, failed its input guard at a later launch
("expected ... stride 8==96") and the backward region fell back to per-op for good.
``torch.tensor([])`` in the same method is a boundary op: the flush, and the compile it starts,
ran inside the device kernel, where FakeTensorMode refused to start ("you set no_dispatch()").
"""
import torch

from neuron_lab import runtime
from neuron_lab.device import shell
from neuron_lab.runtime import knobs


def _cache_update(x, w):
    k = torch.tanh((x @ w) * 0.5 + 1.0).view(4, 12, 2, 8).transpose(1, 2)   # strides (192, 8, 16, 1)
    empty = torch.tensor([], device=x.device)   # a boundary op: the flush runs inside its kernel
    return torch.cat([empty, k * 2.0], dim=-2)


def test_fused_outputs_keep_eagers_layout_and_feed_the_next_region():
    g = torch.Generator().manual_seed(0)
    x_cpu, w_cpu = torch.randn(48, 16, generator=g), torch.randn(16, 16, generator=g)
    x, w = x_cpu.to("neuron"), w_cpu.to("neuron")
    ref = _cache_update(x_cpu, w_cpu)
    assert ref.is_contiguous()
    with knobs.TRIALS.scoped(0):
        for _ in range(8):
            c = _cache_update(x, w)
            s = (c * c).sum(-1)                             # a region reading c
            h = shell.host(c)
            assert c.stride() == ref.stride() and h.stride() == ref.stride()
            torch.testing.assert_close(c.cpu(), ref, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(c.flatten().cpu(), ref.flatten(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(s.cpu(), (ref * ref).sum(-1), rtol=1e-5, atol=1e-5)
    st = runtime.stats()
    assert st["compiles_failed"] == 0, runtime.regions()
    fused = {r["first_ops"][0]: r["fused_launches"] for r in runtime.regions()}
    assert fused["aten::mm"] >= 4 and fused["aten::mul.Tensor"] >= 4, runtime.regions()
