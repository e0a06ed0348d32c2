"""Idioms: data loading and mixed precision."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import idiom, make_data, make_mlp, params_of, train_loop

# --- data loading -------------------------------------------------------------------------

@idiom("DataLoader(pin_memory=True, shuffle with a Generator) + .to(dev, non_blocking=True)")
def dataloader_pinned(dev):
    x, y = make_data()
    ds = torch.utils.data.TensorDataset(x, y)
    dl = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, pin_memory=True,
                                     generator=torch.Generator().manual_seed(0))
    model = make_mlp().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pinned = []
    losses = []
    for xb, yb in dl:
        pinned.append(xb.is_pinned())
        xb, yb = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return {"losses": losses, "params": params_of(model), "pinned": all(pinned)}


@idiom("random_split + DataLoader(drop_last) + gradient accumulation")
def grad_accumulation(dev):
    x, y = make_data(40)
    train, _ = torch.utils.data.random_split(torch.utils.data.TensorDataset(x, y), [32, 8],
                                             generator=torch.Generator().manual_seed(1))
    model = make_mlp().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for i, (xb, yb) in enumerate(torch.utils.data.DataLoader(train, batch_size=4, drop_last=True)):
        loss = F.cross_entropy(model(xb.to(dev)), yb.to(dev)) / 2
        loss.backward()
        if i % 2 == 1:
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return {"losses": losses, "params": params_of(model)}


# --- mixed precision ----------------------------------------------------------------------

@idiom("AMP recipe: torch.autocast(dev, bfloat16) + GradScaler(dev), MSELoss, unscale_ + clip")
def amp_grad_scaler(dev):
    # the PyTorch AMP recipe's network and loss. Softmax/log_softmax/layer_norm are left out on
    # purpose: under autocast neuron follows CUDA's op lists (they run in float32), CPU's lists
    # keep them in bfloat16, so those results differ by design (docs/compatibility.md)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g)
    model = make_mlp().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(dev, init_scale=2.0 ** 8)
    losses, dtypes = [], set()
    for i in range(0, 32, 8):
        with torch.autocast(dev, dtype=torch.bfloat16):
            out = model(x[i:i + 8].to(dev))
            dtypes.add(str(out.dtype))
            loss = F.mse_loss(out, y[i:i + 8].to(dev))
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.detach())
    return {"losses": losses, "params": params_of(model), "scale": scaler.get_scale(),
            "dtypes": sorted(dtypes)}


@idiom("a bfloat16 model (model.to(torch.bfloat16)) trained with AdamW")
def bfloat16_model(dev):
    x, y = make_data()
    model = make_mlp().to(dev, torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = train_loop(model, opt, [(x[i:i + 8].bfloat16(), y[i:i + 8]) for i in range(0, 32, 8)],
                    dev)
    return {"losses": losses, "params": params_of(model)}
