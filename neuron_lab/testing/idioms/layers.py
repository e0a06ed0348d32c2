"""Idioms: memory formats and layers (channels_last, packed LSTM, attention)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import idiom, params_of, train_loop

# --- memory formats and layers ------------------------------------------------------------

@idiom("channels_last CNN (model and input) with BatchNorm, trained with SGD")
def channels_last(dev):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 8, 8, generator=g)
    y = torch.randint(0, 5, (4,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Conv2d(8, 8, 3), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 5))
    model = model.to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    xl = x.to(dev).to(memory_format=torch.channels_last)
    feats = model[0](xl)
    losses = train_loop(model, opt, [(xl, y)] * 3, dev)
    return {"losses": losses, "params": params_of(model),
            "cl": feats.is_contiguous(memory_format=torch.channels_last)}


# not bitwise: on an accelerator PyTorch's LSTM runs the fused cell (CUDA's gate order, see
# device/host_gaps.py), on CPU the unfused one; float32 rounding apart
@idiom("LSTM over pack_padded_sequence (the NLP tutorial's classifier)", exact=False)
def lstm_packed(dev):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 4, generator=g)
    lengths = torch.tensor([5, 3, 2])
    torch.manual_seed(0)
    lstm, head = nn.LSTM(4, 6, batch_first=True), nn.Linear(6, 2)
    lstm, head = lstm.to(dev), head.to(dev)
    packed = nn.utils.rnn.pack_padded_sequence(x.to(dev), lengths, batch_first=True)
    out, (h, _) = lstm(packed)
    padded, lens = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
    loss = head(h[-1]).logsumexp(-1).mean() + padded.square().mean()
    loss.backward()
    return {"loss": loss.detach(), "grads": [p.grad for p in lstm.parameters()], "lens": lens.tolist(),
            "batch_sizes_on_cpu": packed.batch_sizes.is_cpu and lens.is_cpu}


@idiom("nn.MultiheadAttention + F.scaled_dot_product_attention with a causal mask")
def attention(dev):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 5, 8, generator=g).to(dev)
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).to(dev)
    mask = nn.Transformer.generate_square_subsequent_mask(5, device=dev)
    out, w = mha(q, q, q, attn_mask=mask)
    s = F.scaled_dot_product_attention(q.unsqueeze(1), q.unsqueeze(1), q.unsqueeze(1),
                                       is_causal=True)
    (out.sum() + s.sum()).backward()
    return {"out": out.detach(), "w": w.detach(), "sdpa": s, "grads": [p.grad for p in mha.parameters()]}
