"""What every idiom module shares: the registry (``IDIOMS``, filled by ``@idiom`` in catalogue
order), the tolerance for fused programs, and the small model, data and training loop several
idioms start from."""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

FUSED_TOL = dict(rtol=1e-4, atol=1e-5)


def tol(dtype: torch.dtype) -> dict:
    """FUSED_TOL, or for 16-bit floats their own precision (assert_close's defaults): a fused
    program computes bfloat16 ops in float32 and rounds once, eager rounds after every op."""
    if dtype in (torch.bfloat16, torch.float16):
        return dict(rtol=1.6e-2 if dtype == torch.bfloat16 else 1e-3, atol=1e-5)
    return FUSED_TOL

# Idioms that do not run on neuron yet, with the clear error a user gets (tests check the error,
# so a fix shows up as a test to update).
KNOWN: dict[str, str] = {}


class Idiom(NamedTuple):
    name: str
    what: str           # the compatibility table's description
    fn: Callable        # (dev: str) -> dict of results
    exact: bool = True  # bitwise outside fused programs; False: FUSED_TOL (reason at the idiom)


IDIOMS: dict[str, Idiom] = {}


def idiom(what: str, exact: bool = True):
    def deco(fn):
        IDIOMS[fn.__name__] = Idiom(fn.__name__, what, fn, exact)
        return fn
    return deco


def make_data(n=32, d=8, k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, k, (n,), generator=g)


def make_mlp(d=8, h=16, k=4, dropout=0.0):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Dropout(dropout), nn.Linear(h, k))


def params_of(m) -> dict:
    return {k: v.detach() for k, v in m.state_dict().items()}


def train_loop(model, opt, batches, dev, steps=None, scheduler=None, clip=None):
    losses = []
    for i, (x, y) in enumerate(batches):
        loss = F.cross_entropy(model(x.to(dev)), y.to(dev))
        opt.zero_grad()
        loss.backward()
        if clip is not None:
            losses.append(nn.utils.clip_grad_norm_(model.parameters(), clip).detach())
        opt.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.detach())
        if steps is not None and i + 1 >= steps:
            break
    return losses
