"""Idioms: functional transforms (``torch.func``, double backward) and randomness."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import idiom, make_data, make_mlp

# --- functional transforms ----------------------------------------------------------------

@idiom("torch.func.grad + functional_call")
def func_grad(dev):
    x, y = make_data()
    model = make_mlp().to(dev)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_fn(p, xb, yb):
        return F.cross_entropy(torch.func.functional_call(model, p, (xb,)), yb)
    g = torch.func.grad(loss_fn)(params, x.to(dev), y.to(dev))
    return {"grads": g}


@idiom("per-sample gradients: vmap(grad(...)) (the torch.func tutorial)")
def func_vmap_per_sample(dev):
    x, y = make_data(8)
    model = make_mlp().to(dev)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_one(p, xi, yi):
        out = torch.func.functional_call(model, p, (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0))
    g = torch.func.vmap(torch.func.grad(loss_one), in_dims=(None, 0, 0))(params, x.to(dev),
                                                                        y.to(dev))
    return {"grads": g}


@idiom("torch.func.jacrev / hessian of a small function")
def func_jacobian(dev):
    w = torch.linspace(-1, 1, 6).reshape(2, 3).to(dev)

    def f(v):
        return torch.tanh(w @ v).sum() + (v ** 3).sum()
    v = torch.tensor([0.1, -0.2, 0.3]).to(dev)
    return {"jac": torch.func.jacrev(f)(v), "hess": torch.func.hessian(f)(v)}


@idiom("gradient penalty: autograd.grad(create_graph=True), double backward")
def gradient_penalty(dev):
    x, _ = make_data(8)
    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(dev)
    xr = x.to(dev).requires_grad_()
    out = critic(xr)
    (g,) = torch.autograd.grad(out.sum(), xr, create_graph=True)
    penalty = ((g.norm(2, dim=1) - 1) ** 2).mean()
    penalty.backward()
    return {"penalty": penalty.detach(), "grads": [p.grad for p in critic.parameters()]}


# --- randomness -------------------------------------------------------------------------

@idiom("torch.Generator(device=dev): seeded randn/randint/randperm/dropout via manual_seed")
def device_generator(dev):
    g = torch.Generator(device=dev).manual_seed(42)
    a = torch.randn(5, device=dev, generator=g)
    b = torch.randint(0, 10, (5,), device=dev, generator=g)
    p = torch.randperm(7, device=dev, generator=g)
    state = g.get_state()
    c = torch.rand(3, device=dev, generator=g)
    g.set_state(state)
    again = torch.equal(torch.rand(3, device=dev, generator=g), c)
    torch.manual_seed(3)
    d = F.dropout(torch.ones(10, device=dev), 0.5)
    return {"a": a, "b": b, "p": p, "c": c, "replay": again, "dropout": d}


@idiom("nn.init with torch.manual_seed, then fork_rng for a side computation")
def init_and_fork_rng(dev):
    torch.manual_seed(7)
    w = torch.empty(4, 6, device=dev)
    nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    nn.init.trunc_normal_(b := torch.empty(6, device=dev), std=0.02)
    with torch.random.fork_rng(**({} if dev == "cpu" else {"device_type": dev})):
        torch.randn(3, device=dev)
    after = torch.randn(3, device=dev)
    return {"w": w, "b": b, "after": after}


class _VAE(nn.Module):
    """PyTorch examples' VAE (vae/main.py), smaller: 64 -> 32 -> 8 latent dims."""
    def __init__(self):
        super().__init__()
        self.fc1, self.fc21, self.fc22 = nn.Linear(64, 32), nn.Linear(32, 8), nn.Linear(32, 8)
        self.fc3, self.fc4 = nn.Linear(8, 32), nn.Linear(32, 64)

    def forward(self, x):
        h1 = F.relu(self.fc1(x))
        mu, logvar = self.fc21(h1), self.fc22(h1)
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)                    # reparameterize: a draw every step
        z = mu + eps * std
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar


@idiom("VAE with the reparameterization trick (PyTorch examples): randn_like every step, Adam")
def vae_reparameterization(dev):
    x = torch.rand(32, 64, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = _VAE().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for i in range(0, 32, 8):
        batch = x[i:i + 8].to(dev)
        recon, mu, logvar = model(batch)
        bce = F.binary_cross_entropy(recon, batch, reduction="sum")
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        loss = bce + kld
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return {"losses": losses, "fc4": model.fc4.weight.detach()}
