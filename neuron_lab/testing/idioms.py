"""Everyday training-script idioms, as people paste them from PyTorch tutorials, run on CPU and
on ``neuron`` and compared.

Each idiom is a function ``idiom(dev) -> dict`` written once for any device (the only
device-specific words are the ones a user writes: ``device=dev``, ``torch.autocast(dev)``,
``GradScaler(dev)``); what it returns (losses, weights, gradients, flags) must equal CPU's:
**bitwise** in ``eager`` and in ``adaptive`` with per-op replay (the device runs CPU's kernels),
within ``FUSED_TOL`` when the adaptive runtime runs fused programs. Tensors come back to the
host for comparison; a flag such as "the parameter is still the tied one" compares as a value.

``python -m neuron_lab.testing.compat`` runs them into ``docs/compatibility.md``.
"""
from __future__ import annotations

import copy
import io
import math
import tempfile
from typing import Callable, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

FUSED_TOL = dict(rtol=1e-4, atol=1e-5)


def _tol(dtype: torch.dtype) -> dict:
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


def _data(n=32, d=8, k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, k, (n,), generator=g)


def _mlp(d=8, h=16, k=4, dropout=0.0):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Dropout(dropout), nn.Linear(h, k))


def _params(m) -> dict:
    return {k: v.detach() for k, v in m.state_dict().items()}


def _train(model, opt, batches, dev, steps=None, scheduler=None, clip=None):
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


# --- data loading -------------------------------------------------------------------------

@idiom("DataLoader(pin_memory=True, shuffle with a Generator) + .to(dev, non_blocking=True)")
def dataloader_pinned(dev):
    x, y = _data()
    ds = torch.utils.data.TensorDataset(x, y)
    dl = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, pin_memory=True,
                                     generator=torch.Generator().manual_seed(0))
    model = _mlp().to(dev)
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
    return {"losses": losses, "params": _params(model), "pinned": all(pinned)}


@idiom("random_split + DataLoader(drop_last) + gradient accumulation")
def grad_accumulation(dev):
    x, y = _data(40)
    train, _ = torch.utils.data.random_split(torch.utils.data.TensorDataset(x, y), [32, 8],
                                             generator=torch.Generator().manual_seed(1))
    model = _mlp().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for i, (xb, yb) in enumerate(torch.utils.data.DataLoader(train, batch_size=4, drop_last=True)):
        loss = F.cross_entropy(model(xb.to(dev)), yb.to(dev)) / 2
        loss.backward()
        if i % 2 == 1:
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return {"losses": losses, "params": _params(model)}


# --- mixed precision ----------------------------------------------------------------------

@idiom("AMP recipe: torch.autocast(dev, bfloat16) + GradScaler(dev), MSELoss, unscale_ + clip")
def amp_grad_scaler(dev):
    # the PyTorch AMP recipe's network and loss. Softmax/log_softmax/layer_norm are left out on
    # purpose: under autocast neuron follows CUDA's op lists (they run in float32), CPU's lists
    # keep them in bfloat16, so those results differ by design (docs/compatibility.md)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g)
    model = _mlp().to(dev)
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
    return {"losses": losses, "params": _params(model), "scale": scaler.get_scale(),
            "dtypes": sorted(dtypes)}


@idiom("a bfloat16 model (model.to(torch.bfloat16)) trained with AdamW")
def bfloat16_model(dev):
    x, y = _data()
    model = _mlp().to(dev, torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = _train(model, opt, [(x[i:i + 8].bfloat16(), y[i:i + 8]) for i in range(0, 32, 8)],
                    dev)
    return {"losses": losses, "params": _params(model)}


# --- memory-saving and optimisation utilities ------------------------------------------------

@idiom("torch.utils.checkpoint (non-reentrant) around a block with dropout")
def activation_checkpointing(dev):
    x, y = _data()
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
    return {"losses": losses, "params": _params(block)}


@idiom("LR schedulers: LinearLR warm-up -> CosineAnnealingLR (SequentialLR), OneCycleLR")
def lr_schedulers(dev):
    x, y = _data()
    batches = [(x[i:i + 4], y[i:i + 4]) for i in range(0, 32, 4)]
    model = _mlp().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, 0.1, total_iters=3),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=5)], milestones=[3])
    losses = _train(model, opt, batches, dev, scheduler=sched)
    m2 = _mlp().to(dev)
    opt2 = torch.optim.Adam(m2.parameters(), lr=1e-2)
    one = torch.optim.lr_scheduler.OneCycleLR(opt2, max_lr=0.05, total_steps=8)
    losses += _train(m2, opt2, batches, dev, scheduler=one)
    return {"losses": losses, "params": _params(model), "lr": sched.get_last_lr()}


@idiom("ReduceLROnPlateau on the validation loss (.item())")
def reduce_on_plateau(dev):
    x, y = _data()
    model = _mlp().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
    vals = []
    for _ in range(4):
        _train(model, opt, [(x[:16], y[:16])], dev)
        with torch.no_grad():
            val = F.cross_entropy(model(x[16:].to(dev)), y[16:].to(dev)).item()
        sched.step(val)
        vals.append(val)
    return {"val": vals, "lr": opt.param_groups[0]["lr"], "params": _params(model)}


@idiom("clip_grad_norm_ (foreach) and clip_grad_value_")
def grad_clipping(dev):
    x, y = _data()
    model = _mlp().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = _train(model, opt, [(x[i:i + 8] * 5, y[i:i + 8]) for i in range(0, 32, 8)], dev, clip=0.5)
    nn.utils.clip_grad_value_(model.parameters(), 0.01)
    return {"losses": out, "grads": [p.grad for p in model.parameters()]}


@idiom("torch.optim.swa_utils.AveragedModel (EMA) + copy.deepcopy")
def ema_and_deepcopy(dev):
    x, y = _data()
    model = _mlp().to(dev)
    ema = torch.optim.swa_utils.AveragedModel(
        model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    twin = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for i in range(0, 32, 8):
        _train(model, opt, [(x[i:i + 8], y[i:i + 8])], dev)
        ema.update_parameters(model)
    return {"ema": _params(ema.module), "twin_on_dev": next(twin.parameters()).device.type == dev,
            "twin": _params(twin)}


# --- functional transforms ----------------------------------------------------------------

@idiom("torch.func.grad + functional_call")
def func_grad(dev):
    x, y = _data()
    model = _mlp().to(dev)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_fn(p, xb, yb):
        return F.cross_entropy(torch.func.functional_call(model, p, (xb,)), yb)
    g = torch.func.grad(loss_fn)(params, x.to(dev), y.to(dev))
    return {"grads": g}


@idiom("per-sample gradients: vmap(grad(...)) (the torch.func tutorial)")
def func_vmap_per_sample(dev):
    x, y = _data(8)
    model = _mlp().to(dev)
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
    x, _ = _data(8)
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
    losses = _train(model, opt, [(xl, y)] * 3, dev)
    return {"losses": losses, "params": _params(model),
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


# --- serialization and module surgery -------------------------------------------------------

@idiom("torch.save(model/optimizer state_dict) -> torch.load(map_location) -> resume training")
def checkpoint_resume(dev):
    x, y = _data()
    model = _mlp().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train(model, opt, [(x[:8], y[:8])], dev)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ck = torch.load(buf, map_location=dev, weights_only=True)
    m2 = _mlp().to(dev)
    m2.load_state_dict(ck["model"])
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-2)
    o2.load_state_dict(ck["opt"])
    losses = _train(m2, o2, [(x[8:16], y[8:16]), (x[16:24], y[16:24])], dev)
    return {"losses": losses, "params": _params(m2),
            "state_device": ck["opt"]["state"][0]["exp_avg"].device.type == dev}


@idiom("meta-device init -> to_empty(device) -> reset_parameters, and load_state_dict(assign=True)")
def meta_init(dev):
    with torch.device("meta"):
        m = _mlp()
    m = m.to_empty(device=dev)
    torch.manual_seed(5)
    for mod in m.modules():
        if hasattr(mod, "reset_parameters"):
            mod.reset_parameters()
    with torch.device("meta"):
        m2 = _mlp()
    m2.load_state_dict(m.state_dict(), assign=True)
    x, _ = _data(4)
    return {"params": _params(m), "out": m2(x.to(dev)).detach(),
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


@idiom("parametrizations: weight_norm and orthogonal, trained")
def parametrizations(dev):
    x, y = _data()
    model = _mlp()
    nn.utils.parametrizations.weight_norm(model[0])
    nn.utils.parametrizations.orthogonal(model[3])
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = _train(model, opt, [(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)], dev)
    return {"losses": losses, "w0": model[0].weight.detach(), "w3": model[3].weight.detach()}


@idiom("forward hooks, full backward hooks and Tensor.register_hook")
def hooks(dev):
    x, y = _data(8)
    model = _mlp().to(dev)
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
    x, y = _data()
    model = _mlp(dropout=0.3).to(dev)
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


# --- running and comparing ----------------------------------------------------------------

def _flat(r) -> list:
    leaves, spec = torch.utils._pytree.tree_flatten(r)
    return [(x.detach().cpu(), x.device.type, x.dtype) if isinstance(x, torch.Tensor) else x
            for x in leaves], spec


def compare(cpu, dev, dev_type: str, exact: bool) -> str:
    """'' when ``dev``'s results equal ``cpu``'s, else the first difference."""
    (a, sa), (b, sb) = _flat(cpu), _flat(dev)
    if sa != sb:
        return f"different result structure: {sb} vs CPU {sa}"
    for i, (x, z) in enumerate(zip(a, b)):
        if type(x) is tuple:
            t, _, dt = x
            u, where, dt2 = z
            if where != dev_type:
                return f"result {i} is on {where}, not {dev_type}"
            if dt != dt2 or t.shape != u.shape:
                return f"result {i}: {dt2} {tuple(u.shape)} vs CPU {dt} {tuple(t.shape)}"
            same = torch.equal(t, u) if exact else torch.allclose(
                t.float(), u.float(), equal_nan=True, **_tol(t.dtype))
            if not same:
                return f"result {i} differs by {(t.float() - u.float()).abs().max().item():.3g}"
        elif x != z and not (exact is False and isinstance(x, float)
                             and math.isclose(x, z, rel_tol=FUSED_TOL["rtol"])):
            return f"result {i}: {z!r} vs CPU {x!r}"
    return ""


def run(name: str, mode: str, compile: bool = False):
    """Run idiom ``name`` on CPU and on neuron in ``mode``; a ``zoo.Verdict``."""
    import neuron_lab

    from .zoo import Verdict, device_mode, with_failed_regions
    fn, exact = IDIOMS[name].fn, IDIOMS[name].exact and not compile
    cpu = fn("cpu")
    label = mode + ("+fused" if compile else "")
    try:
        with device_mode(mode, compile):
            dev = fn("neuron")
            neuron_lab.sync()
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return Verdict(name, label, False, f"{type(e).__name__}: {first[:300]}")
    why = compare(cpu, dev, "neuron", exact=exact)
    v = Verdict(name, label, not why, why)
    return with_failed_regions(v) if compile else v
