"""Ops that looked like boundaries but are ordinary device ops (found on the W6 Llama step):
a dtype cast that stays on ``neuron`` and attention with ``dropout_p=0`` neither cut a region
nor count as host fallbacks."""
import pytest
import torch
import torch.nn.functional as F

import neuron_lab
from neuron_lab import runtime
from neuron_lab.runtime import knobs


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


def _scaled(x, s, n=1):
    for _ in range(n):
        x = (x * s).tanh() + s
    return x


def test_cpu_scalar_operand_is_queued_with_its_value_at_the_call(compile_off):
    """``x * torch.tensor(1.5)`` with ``x`` on neuron: the CPU scalar no longer ends the segment
    (it did: "host-arg", every op per-op), and each call reads the value it had at the call,
    though the op runs at the sync and the user changes the tensor before it."""
    x = torch.randn(4, 8)
    s = torch.tensor(1.5)
    want = []
    for _ in range(4):
        want.append(_scaled(x, s))
        s += 0.25
    s = torch.tensor(1.5)
    dx = x.to("neuron")
    got = []
    for _ in range(4):
        got.append(_scaled(dx, s))      # pending until the sync
        s += 0.25
        neuron_lab.sync()
    stats = runtime.stats()
    assert "host-arg" not in stats["flushes"] and stats["hits"] >= 1
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)


def test_cpu_scalar_operand_keeps_type_promotion_and_autograd(compile_off):
    """A 0-dim tensor promotes differently from a Python number (a half tensor times a float32
    0-dim tensor stays half; an int tensor times it is float32); the gradient of a CPU scalar
    that requires it lands on the CPU, as it does on CPU alone."""
    def step(x, i, s):
        y = (x * s).sum() + (i * s).sum() + torch.clamp(x.float(), min=s).sum()
        y.backward()
        return y, (x * s).dtype, (i * s).dtype
    x, i = torch.randn(3, 5).half(), torch.arange(6, dtype=torch.int32)
    s = torch.tensor(0.5, requires_grad=True)
    want = step(x, i, s)
    want_grad = s.grad.clone()
    for _ in range(3):
        s.grad = None
        got = step(x.to("neuron"), i.to("neuron"), s)
    assert "host-arg" not in runtime.stats()["flushes"]
    assert got[1:] == want[1:] == (torch.float16, torch.float32)
    assert torch.equal(got[0].cpu(), want[0])
    assert s.grad.device.type == "cpu" and torch.equal(s.grad, want_grad)


def test_cpu_scalar_operand_in_a_fused_region():
    x, s = torch.randn(64, 32), torch.tensor(0.75)
    want = _scaled(x, s, 8)
    dx = x.to("neuron")
    with knobs.TRIALS.scoped(1):
        for _ in range(6):
            got = _scaled(dx, s, 8)
            neuron_lab.sync()
    assert runtime.stats()["launches_fused"] >= 1
    assert torch.allclose(got.cpu(), want, rtol=1e-5, atol=1e-6)


def _shift_and_write(ids, y):
    """Transformers' ``shift_tokens_right`` (a slice assignment: ``copy_`` into a view), a
    write into part of a tensor made in the segment, and a cast into a buffer of another dtype."""
    s = ids.new_zeros(ids.shape)
    s[:, 1:] = ids[:, :-1].clone()
    s[:, 0] = 7
    z = y * 2
    z[1:].copy_(y[:-1])
    buf = torch.empty(y.shape, dtype=torch.float16, device=y.device)
    buf.copy_(z + s.float().sum())
    return s, z, buf


def test_copy_between_device_tensors_is_queued(compile_off):
    """``copy_`` between neuron tensors is an in-place op like any other (it was a "transfer"
    boundary: a slice assignment cut the segment); one from the host still ends it."""
    ids, y = torch.arange(12).reshape(3, 4), torch.randn(5, 4)
    want = _shift_and_write(ids, y)
    for _ in range(3):
        got = _shift_and_write(ids.to("neuron"), y.to("neuron"))
        neuron_lab.sync()
    stats = runtime.stats()
    assert "transfer" not in stats["flushes"] and stats["hits"] >= 1
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g.cpu(), w)
    dst = torch.zeros(4, device="neuron")
    dst.add_(1).copy_(torch.arange(4.0))                  # from the host: a transfer, now
    assert runtime.stats()["flushes"].get("transfer") == 1
    assert torch.equal(dst.cpu(), torch.arange(4.0))


def test_copy_between_device_tensors_in_a_fused_region():
    ids, y = torch.arange(12).reshape(3, 4), torch.randn(5, 4)
    want = _shift_and_write(ids, y)
    with knobs.TRIALS.scoped(1):
        for _ in range(6):
            got = _shift_and_write(ids.to("neuron"), y.to("neuron"))
            neuron_lab.sync()
    stats = runtime.stats()
    assert stats["launches_fused"] >= 1 and "transfer" not in stats["flushes"]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.allclose(g.cpu(), w, rtol=1e-3, atol=1e-3)


def _dropout_step(x, lin, cpu_draws):
    """Dropout between device ops, with a CPU draw (a data loader's, an augmentation's) made
    while the dropout's region is still queued: eager draws the mask first."""
    h = F.dropout(lin(x).relu(), p=0.3, training=True)
    noise = torch.randn(3)                # the host generator, before the region runs
    cpu_draws.append(noise)
    h = F.dropout(h.t(), p=0.5) * 2       # a transposed input
    return h.sum(0) + F.dropout(h, p=1.0).sum() + F.dropout(h, p=0.0).sum()


def test_dropout_is_queued_with_eager_draws(compile_off):
    """``native_dropout`` no longer ends the segment ("rng"): its mask is drawn at the call,
    so a CPU draw made before the region runs gets the numbers it gets in eager mode."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 5)
    x = torch.randn(4, 6)
    torch.manual_seed(1)
    want_draws, want = [], []
    for _ in range(3):
        want.append(_dropout_step(x, lin, want_draws))
    dlin, dx = lin.to("neuron"), x.to("neuron")
    torch.manual_seed(1)
    draws, got = [], []
    for _ in range(3):
        got.append(_dropout_step(dx, dlin, draws))
        neuron_lab.sync()
    stats = runtime.stats()
    assert stats["flushes"].get("rng", 0) == 3 and stats["hits"] >= 1   # only the transposed one
    for a, b in zip(draws, want_draws):
        assert torch.equal(a, b)
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)


def _trains_fused_as_on_cpu(make, loss_of):
    """``make(dev)`` -> (model, optimizer, batch); 6 steps on CPU and on neuron (fused after one
    trial): no "rng" cut, a fused launch, losses and weights CPU's within the fused tolerance."""
    def train(dev):
        torch.manual_seed(0)
        model, opt, batch = make(dev)
        losses = []
        for _ in range(6):
            loss = loss_of(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, [p.detach().cpu() for p in model.parameters()]
    want = train("cpu")
    with knobs.TRIALS.scoped(1):
        got = train("neuron")
    stats = runtime.stats()
    assert "rng" not in stats["flushes"] and stats["launches_fused"] >= 1
    assert got[0] == pytest.approx(want[0], rel=1e-4)
    for g, w in zip(got[1], want[1]):
        assert torch.allclose(g, w, rtol=1e-3, atol=1e-4)


def test_dropout_training_fuses_and_matches_cpu():
    """A dropout MLP trained with AdamW: the step is one forward+backward region (it was cut at
    each dropout), fused, its losses and weights CPU's within the fused tolerance."""
    def make(dev):
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.GELU(),
                                torch.nn.Linear(16, 4), torch.nn.Dropout(0.1)).to(dev)
        x, y = torch.randn(32, 8).to(dev), torch.randint(0, 4, (32,)).to(dev)
        return m, torch.optim.AdamW(m.parameters(), lr=1e-2), (x, y)
    _trains_fused_as_on_cpu(make, lambda m, b: F.cross_entropy(m(b[0]), b[1]))


def _noisy_step(x, lin, cpu_draws):
    h = lin(x).tanh()
    noise = torch.randn(h.shape, device=h.device)            # a factory on the device
    jitter = torch.rand_like(x)                               # *_like of a non-pending input
    cpu_draws.append(torch.randn(2))                          # the host generator, meanwhile
    return ((h + 0.1 * noise).sum(1) + lin(x + jitter).sum(1)).square().sum()


def test_random_factories_are_drawn_at_the_call_without_a_cut(compile_off):
    """``torch.randn(shape, device=...)`` and ``rand_like`` of a tensor whose value is there run
    at the call, the queue left as it is: no "rng" flush, the step one region, and every draw
    (theirs and the CPU ones between them) eager's."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 5)
    x = torch.randn(4, 6)
    dlin, dx = lin.to("neuron"), x.to("neuron")
    results = {}
    for mode in ("eager", "adaptive"):
        with neuron_lab.mode(mode):
            torch.manual_seed(1)          # the device's random ops draw on the host generator
            draws, got = [], []
            for _ in range(4):
                got.append(_noisy_step(dx, dlin, draws).item())
            results[mode] = (draws, got)
    stats = runtime.stats()
    assert "rng" not in stats["flushes"] and stats["hits"] >= 2
    (want_draws, want), (draws, got) = results["eager"], results["adaptive"]
    for a, b in zip(draws, want_draws):
        assert torch.equal(a, b)
    assert got == want


def test_random_ops_reading_or_writing_tensors_still_end_the_segment(compile_off):
    """``bernoulli(p)`` reads a value a queued op computes and ``normal_`` writes a tensor a
    queued op reads: each still ends the segment; ``randn_like`` of a pending tensor does not
    (it reads metadata only). Values stay eager's."""
    x = torch.rand(8).to("neuron")
    with neuron_lab.mode("adaptive"):
        torch.manual_seed(3)
        p = (x * 0.5).clamp(0, 1)                             # queued
        b = torch.bernoulli(p)
        y = x * 2.0                                           # queued, reads x
        x2 = x.clone().normal_()
        z = torch.randn_like(y * 3.0)                         # of a pending tensor
        got = [t.cpu() for t in (b, y, x2, z)]
    flushes = runtime.stats()["flushes"]
    with neuron_lab.mode("eager"):
        torch.manual_seed(3)
        p = (x * 0.5).clamp(0, 1)
        want = [torch.bernoulli(p), x * 2.0, x.clone().normal_(), torch.randn_like(x * 2.0 * 3.0)]
    assert flushes.get("rng", 0) == 2
    for g, w in zip(got, want):
        assert torch.equal(g, w.cpu())


def _vae_loss(vae, x):
    enc, dec = vae
    mu, logvar = enc(x).chunk(2, dim=1)
    std = (0.5 * logvar).exp()
    z = mu + std * torch.randn_like(std)                      # the reparameterization trick
    recon = F.mse_loss(dec(z), x, reduction="sum")
    kl = -0.5 * (1 + logvar - mu.square() - logvar.exp()).sum()
    return recon + kl


def test_vae_training_with_randn_like_fuses_and_matches_cpu():
    """A VAE's ``randn_like(std)`` (``std`` pending: computed in the same step) is drawn at the
    call on a stand-in: the step is one forward+backward region, fused, and its losses and
    weights are CPU's within the fused tolerance."""
    def make(dev):
        vae = torch.nn.ModuleList([
            torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8)),
            torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 12)),
        ]).to(dev)
        return vae, torch.optim.Adam(vae.parameters(), lr=1e-2), torch.randn(32, 12).to(dev)
    _trains_fused_as_on_cpu(make, _vae_loss)
