"""Ops that looked like boundaries but are ordinary device ops (found on the W6 Llama step):
a dtype cast that stays on ``neuron`` and attention with ``dropout_p=0`` neither cut a region
nor count as host fallbacks."""
import torch
import torch.nn.functional as F

import neuron_lab
from neuron_lab import runtime


def _rope_like(pos, inv):
    return (pos[..., None].float() * inv).sin().sum()


def test_same_device_cast_is_queued(compile_off):
    pos, inv = torch.arange(16), torch.rand(8)
    want = _rope_like(pos, inv)
    dp, di = pos.to("neuron"), inv.to("neuron")
    for _ in range(3):
        got = _rope_like(dp, di)
        neuron_lab.sync()
    s = runtime.stats()
    assert "cpu" not in s["flushes"] and s["hits"] >= 1
    assert torch.equal(got.cpu(), want)


def test_attention_without_dropout_is_not_an_rng_fallback(compile_off):
    q = torch.randn(2, 4, 16, 8)
    want = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    neuron_lab.clear_op_tracking()
    dq = q.to("neuron")
    for _ in range(3):
        got = F.scaled_dot_product_attention(dq, dq, dq, is_causal=True).sum()
    neuron_lab.sync()
    assert "rng" not in runtime.stats()["flushes"]
    assert not [f for f in neuron_lab.fallback_ops() if "random" in f["reason"]]
    assert torch.allclose(got.cpu(), want.sum())
    F.scaled_dot_product_attention(dq, dq, dq, dropout_p=0.5)   # dropout draws: a fallback
    neuron_lab.sync()
    assert [f for f in neuron_lab.fallback_ops() if "random" in f["reason"]]
