"""Idioms: serialization and module surgery (checkpoints, meta init, tied weights,
parametrizations, hooks, Transformers round trip), evaluation and losses."""
from __future__ import annotations

import io
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import idiom, make_data, make_mlp, params_of, train_loop

# --- serialization and module surgery -------------------------------------------------------

@idiom("torch.save(model/optimizer state_dict) -> torch.load(map_location) -> resume training")
def checkpoint_resume(dev):
    x, y = make_data()
    model = make_mlp().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_loop(model, opt, [(x[:8], y[:8])], dev)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ck = torch.load(buf, map_location=dev, weights_only=True)
    m2 = make_mlp().to(dev)
    m2.load_state_dict(ck["model"])
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-2)
    o2.load_state_dict(ck["opt"])
    losses = train_loop(m2, o2, [(x[8:16], y[8:16]), (x[16:24], y[16:24])], dev)
    return {"losses": losses, "params": params_of(m2),
            "state_device": ck["opt"]["state"][0]["exp_avg"].device.type == dev}


@idiom("meta-device init -> to_empty(device) -> reset_parameters, and load_state_dict(assign=True)")
def meta_init(dev):
    with torch.device("meta"):
        m = make_mlp()
    m = m.to_empty(device=dev)
    torch.manual_seed(5)
    for mod in m.modules():
        if hasattr(mod, "reset_parameters"):
            mod.reset_parameters()
    with torch.device("meta"):
        m2 = make_mlp()
    m2.load_state_dict(m.state_dict(), assign=True)
    x, _ = make_data(4)
    return {"params": params_of(m), "out": m2(x.to(dev)).detach(),
            "assigned": m2[0].weight.device.type == dev}


@idiom("tied embedding/output weights (word language model tutorial) moved and trained")
def tied_weights(dev):
    torch.manual_seed(0)
    emb, head = nn.Embedding(20, 8), nn.Linear(8, 20)
    head.weight = emb.weight
    m = nn.ModuleList([emb, head]).to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]).to(dev)
    losses = []
    for _ in range(3):
        loss = F.cross_entropy(m[1](m[0](ids)).flatten(0, 1), ids.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return {"losses": losses, "tied": m[0].weight is m[1].weight, "w": m[0].weight.detach()}


class _CpuScaled(nn.Module):
    """A scale kept as a plain tensor attribute, not a buffer: ``.to(dev)`` leaves it on the
    CPU, and PyTorch takes a 0-dim CPU tensor as a scalar operand of device ops."""
    def __init__(self) -> None:
        super().__init__()
        self.lin, self.out = nn.Linear(8, 16), nn.Linear(16, 4)
        self.scale = torch.tensor(16 ** -0.5)
        self.temperature = torch.tensor(1.0)

    def forward(self, x):
        return self.out(torch.relu(self.lin(x)) * self.scale) / self.temperature


@idiom("a 0-dim CPU tensor attribute (not a buffer) scales device activations; changed each step")
def cpu_scalar_attribute(dev):
    x, y = make_data()
    torch.manual_seed(0)
    model = _CpuScaled().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for i in range(0, 32, 8):
        loss = F.cross_entropy(model(x[i:i + 8].to(dev)), y[i:i + 8].to(dev))
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.temperature += 0.5          # read by the next step's ops at their call
        losses.append(loss.detach())
    return {"losses": losses, "params": params_of(model), "on_cpu": model.scale.device.type}


@idiom("parametrizations: weight_norm and orthogonal, trained")
def parametrizations(dev):
    x, y = make_data()
    model = make_mlp()
    nn.utils.parametrizations.weight_norm(model[0])
    nn.utils.parametrizations.orthogonal(model[3])
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = train_loop(model, opt, [(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)], dev)
    return {"losses": losses, "w0": model[0].weight.detach(), "w3": model[3].weight.detach()}


@idiom("forward hooks, full backward hooks and Tensor.register_hook")
def hooks(dev):
    x, y = make_data(8)
    model = make_mlp().to(dev)
    seen = {}
    model[0].register_forward_hook(lambda m, i, o: seen.__setitem__("act", o.detach()))
    model[3].register_full_backward_hook(lambda m, gi, go: seen.__setitem__("gout", go[0]))
    model[0].weight.register_hook(lambda g: g * 0.5)
    loss = F.cross_entropy(model(x.to(dev)), y.to(dev))
    loss.backward()
    return {"seen": seen, "g0": model[0].weight.grad}


@idiom("Transformers save_pretrained -> from_pretrained round trip (safetensors)")
def save_pretrained(dev):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=32)
    model = GPT2LMHeadModel(cfg).to(dev)
    ids = torch.tensor([[1, 2, 3, 4]]).to(dev)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        back = GPT2LMHeadModel.from_pretrained(d).to(dev)
    return {"logits": back(ids).logits.detach(),
            "tied": back.lm_head.weight is back.transformer.wte.weight}


@idiom("model.eval() + torch.no_grad() accuracy loop with .item() and argmax")
def eval_accuracy(dev):
    x, y = make_data()
    model = make_mlp(dropout=0.3).to(dev)
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, 32, 8):
            pred = model(x[i:i + 8].to(dev)).argmax(dim=1)
            correct += (pred == y[i:i + 8].to(dev)).sum().item()
    return {"acc": correct / 32}


@idiom("label smoothing + ignore_index cross-entropy, masked_fill, boolean indexing")
def losses_and_masks(dev):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5, generator=g).to(dev).requires_grad_()
    target = torch.tensor([0, 1, -100, 3, 4, -100]).to(dev)
    loss = F.cross_entropy(logits, target, label_smoothing=0.1, ignore_index=-100)
    loss.backward()
    masked = logits.detach().masked_fill(logits.detach() < 0, float("-inf")).softmax(-1)
    picked = logits.detach()[target != -100]
    return {"loss": loss.detach(), "grad": logits.grad, "masked": masked, "picked": picked}
