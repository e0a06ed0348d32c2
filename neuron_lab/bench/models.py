"""The models the training workloads run: an MLP (W3, W5), a tiny GPT (W4) and a Transformers
Llama built from its config (W6, no download), plus one train step.

Both are plain ``nn.Module``s with no dropout and no RNG inside the step, so every peer runs the
same ops. Attention is written out (matmul, an additive causal mask, softmax) rather than
``scaled_dot_product_attention``, so no peer gets a special kernel the others lack Three q/k/v
projections rather than one fused ``qkv`` split: on torch._lazy (TS backend, torch 2.13) a matmul
of ``split`` views followed by a broadcasting add raises "Input tensor is not a lazy tensor".
Inputs are generated once on the host under a fixed seed and moved to the peer's device.

The optimizer is AdamW with its implementation set explicitly and the same for every peer
(``OPTIMIZER``; ``--optimizer`` on the command line). PyTorch's default picks per device:
foreach on ``neuron`` (a PrivateUse1 device is on its foreach list) and single-tensor on CPU and
``lazy``, which would make the peers run different ops.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MLP_SIZES = (256, 512, 512, 10)
MLP_BATCH = 128
GPT = dict(vocab=256, d=128, heads=4, layers=2, T=64, batch=16)
OPTIMIZER = {"foreach": True}     # AdamW's implementation for every peer (``set_optimizer``)
LLAMA = dict(vocab=256, d=128, heads=4, layers=2, T=64, batch=8, ffn=344)


def mlp(sizes=MLP_SIZES) -> nn.Module:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def mlp_batch(device, sizes=MLP_SIZES, batch=MLP_BATCH, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, sizes[0], generator=g)
    y = torch.randint(0, sizes[-1], (batch,), generator=g)
    return x.to(device), y.to(device)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, T: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.proj = nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        causal = torch.full((T, T), float("-inf")).triu(1)      # additive: 0 on and below the diagonal
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        h = self.heads
        a = self.ln1(x)
        q, k, v = (p(a).view(B, T, h, C // h).transpose(1, 2) for p in (self.q, self.k, self.v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // h) ** 0.5)
        att = (att + self.causal[:T, :T]).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, T: int, **_) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(T, d)
        self.blocks = nn.Sequential(*[Block(d, heads, T) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.blocks(self.tok(idx) + self.pos(pos))
        logits = self.head(self.ln(x))
        return logits.view(-1, logits.shape[-1])


def gpt(cfg=GPT) -> nn.Module:
    return TinyGPT(**cfg)


def gpt_batch(device, cfg=GPT, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["T"] + 1), generator=g)
    return idx[:, :-1].contiguous().to(device), idx[:, 1:].reshape(-1).to(device)


class Logits(nn.Module):
    """A Transformers causal LM as ``idx -> logits (B*T, vocab)``, like ``TinyGPT``."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, idx):
        logits = self.lm(input_ids=idx).logits
        return logits.view(-1, logits.shape[-1])


def llama(cfg=LLAMA) -> nn.Module:
    """``LlamaForCausalLM`` from a config (random weights, eager attention via SDPA, no KV cache)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    conf = LlamaConfig(vocab_size=cfg["vocab"], hidden_size=cfg["d"], intermediate_size=cfg["ffn"],
                       num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                       num_key_value_heads=cfg["heads"], max_position_embeddings=cfg["T"],
                       use_cache=False, attn_implementation="sdpa")
    return Logits(LlamaForCausalLM(conf))


_MODELS = {"mlp": (mlp, mlp_batch), "gpt": (gpt, gpt_batch), "llama": (llama, lambda dev, seed: gpt_batch(dev, LLAMA, seed))}


def make(kind: str, peer, seed: int = 0):
    """(model as the peer runs it, its AdamW, (inputs, targets)) on ``peer``'s device."""
    torch.manual_seed(seed)
    build, data = _MODELS[kind]
    model = build().to(peer.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **OPTIMIZER)
    batch = data(peer.device, seed=seed)
    return peer.module(model), opt, batch


def set_optimizer(kind: str) -> None:
    """``"foreach"`` or ``"single-tensor"``: AdamW's implementation for every peer."""
    if kind not in ("foreach", "single-tensor"):
        raise ValueError(f"unknown optimizer implementation {kind!r}")
    OPTIMIZER.clear()
    OPTIMIZER.update(foreach=kind == "foreach")


def train_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss
