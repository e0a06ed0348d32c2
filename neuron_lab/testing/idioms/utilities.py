"""Idioms: memory-saving and optimisation utilities (checkpointing, LR schedulers, clipping, EMA)."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import idiom, make_data, make_mlp, params_of, train_loop

# --- memory-saving and optimisation utilities ------------------------------------------------

@idiom("torch.utils.checkpoint (non-reentrant) around a block with dropout")
def activation_checkpointing(dev):
    x, y = make_data()
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.2), nn.Linear(16, 16)).to(dev)
    head = nn.Linear(16, 4).to(dev)
    opt = torch.optim.SGD([*block.parameters(), *head.parameters()], lr=0.1)
    losses = []
    for i in range(0, 32, 8):
        torch.manual_seed(i)
        h = torch.utils.checkpoint.checkpoint(block, x[i:i + 8].to(dev), use_reentrant=False)
        loss = F.cross_entropy(head(h), y[i:i + 8].to(dev))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return {"losses": losses, "params": params_of(block)}


@idiom("LR schedulers: LinearLR warm-up -> CosineAnnealingLR (SequentialLR), OneCycleLR")
def lr_schedulers(dev):
    x, y = make_data()
    batches = [(x[i:i + 4], y[i:i + 4]) for i in range(0, 32, 4)]
    model = make_mlp().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, 0.1, total_iters=3),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=5)], milestones=[3])
    losses = train_loop(model, opt, batches, dev, scheduler=sched)
    m2 = make_mlp().to(dev)
    opt2 = torch.optim.Adam(m2.parameters(), lr=1e-2)
    one = torch.optim.lr_scheduler.OneCycleLR(opt2, max_lr=0.05, total_steps=8)
    losses += train_loop(m2, opt2, batches, dev, scheduler=one)
    return {"losses": losses, "params": params_of(model), "lr": sched.get_last_lr()}


@idiom("ReduceLROnPlateau on the validation loss (.item())")
def reduce_on_plateau(dev):
    x, y = make_data()
    model = make_mlp().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
    vals = []
    for _ in range(4):
        train_loop(model, opt, [(x[:16], y[:16])], dev)
        with torch.no_grad():
            val = F.cross_entropy(model(x[16:].to(dev)), y[16:].to(dev)).item()
        sched.step(val)
        vals.append(val)
    return {"val": vals, "lr": opt.param_groups[0]["lr"], "params": params_of(model)}


@idiom("clip_grad_norm_ (foreach) and clip_grad_value_")
def grad_clipping(dev):
    x, y = make_data()
    model = make_mlp().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = train_loop(model, opt, [(x[i:i + 8] * 5, y[i:i + 8]) for i in range(0, 32, 8)], dev, clip=0.5)
    nn.utils.clip_grad_value_(model.parameters(), 0.01)
    return {"losses": out, "grads": [p.grad for p in model.parameters()]}


@idiom("torch.optim.swa_utils.AveragedModel (EMA) + copy.deepcopy")
def ema_and_deepcopy(dev):
    x, y = make_data()
    model = make_mlp().to(dev)
    ema = torch.optim.swa_utils.AveragedModel(
        model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    twin = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for i in range(0, 32, 8):
        train_loop(model, opt, [(x[i:i + 8], y[i:i + 8])], dev)
        ema.update_parameters(model)
    return {"ema": params_of(ema.module), "twin_on_dev": next(twin.parameters()).device.type == dev,
            "twin": params_of(twin)}
