"""FlashAttention (issue 45, item 1): ``neuron_lab.library.flash_attention``.

Oracle: ``scaled_dot_product_attention``'s math path (``aten._scaled_dot_product_attention_math``)
with an explicit boolean mask, on the device, for the same inputs. Tolerances, stated at each
comparison: float32 1e-5 (the kernel sums the softmax tile by tile, in another order);
bfloat16/float16 against the float32 reference, the input dtype's rounding (the kernel computes
in float32 and rounds once; the math path rounds every intermediate).
Small tiles (``small_tiles``: 16 × 8) make the small shapes run many tiles, with partially and
fully masked ones.
"""
import importlib
import math

import pytest
import torch

import neuron_lab
from neuron_lab.library import attention_tiles, flash_attention

fa_mod = importlib.import_module("neuron_lab.library.flash_attention")   # the module (the package
                                                                         # name is the function)
OPS = torch.ops.neuron_lab


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(fa_mod, "BLOCK_Q", 16)
    monkeypatch.setattr(fa_mod, "BLOCK_K", 8)


def allowed(t, s, causal, window):
    pos = torch.arange(t)[:, None] + (s - t)
    key = torch.arange(s)[None]
    ok = torch.ones(t, s, dtype=torch.bool)
    if causal:
        ok &= key <= pos
    if window:
        ok &= (pos - key) < window
        if not causal:
            ok &= (key - pos) < window
    return ok


def reference(q, k, v, causal=False, window=None, scale=None, dropout_mask=None, p=0.0):
    """sdpa's math path on q's device, GQA keys expanded, the mask as an additive matrix (the
    math kernel takes what sdpa's front end makes of a boolean mask)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    ok = allowed(q.shape[2], k.shape[2], causal, window)
    mask = torch.zeros(ok.shape, dtype=q.dtype).masked_fill(~ok, -math.inf).to(q.device)
    if dropout_mask is not None:       # the math path takes an explicit dropout mask
        out = torch.ops.aten._scaled_dot_product_attention_math(
            q, k, v, attn_mask=mask, dropout_p=p, scale=scale, dropout_mask=dropout_mask)[0]
    else:
        out = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask=mask,
                                                                 scale=scale)[0]
    return out


def qkv(b=2, h=4, hkv=2, t=37, s=None, d=16, dtype=torch.float32, device="neuron", seed=0):
    g = torch.Generator().manual_seed(seed)
    s = t if s is None else s
    mk = lambda *sh: torch.randn(*sh, generator=g).to(dtype).to(device).requires_grad_()  # noqa
    return mk(b, h, t, d), mk(b, hkv, s, d), mk(b, hkv, s, d)


CASES = [  # (h, hkv, t, s, causal, window)
    pytest.param(4, 4, 37, 37, False, None, id="full"),
    pytest.param(4, 2, 37, 37, True, None, id="causal-gqa"),
    pytest.param(4, 1, 40, 40, True, 9, id="causal-window-mqa"),
    pytest.param(2, 2, 33, 33, False, 5, id="window-both-sides"),
    pytest.param(4, 2, 12, 45, True, None, id="causal-t<s-kvcache"),
    pytest.param(2, 1, 1, 30, True, 8, id="decode-one-query"),
]


@pytest.mark.parametrize("h,hkv,t,s,causal,window", CASES)
def test_matches_sdpa_math_forward_and_backward(eager, small_tiles, h, hkv, t, s, causal, window):
    q, k, v = qkv(h=h, hkv=hkv, t=t, s=s)
    out = flash_attention(q, k, v, causal=causal, window=window)
    grad = torch.randn(out.shape).to("neuron")
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    ref = reference(q, k, v, causal, window)
    rq, rk, rv = torch.autograd.grad(ref, (q, k, v), grad)
    for got, want in ((out, ref), (dq, rq), (dk, rk), (dv, rv)):
        assert got.device.type == "neuron"
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-5, atol=1e-5)
    assert neuron_lab.executed_ops()["neuron_lab::flash_attention_fwd"] == 1
    assert neuron_lab.executed_ops()["neuron_lab::flash_attention_bwd"] == 1


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
def test_half_precision_against_the_float32_reference(eager, small_tiles, dtype, tol):
    """16-bit inputs: outputs and gradients within the dtype's rounding (bf16 2e-2, fp16 2e-3,
    absolute on values of order 1) of the float32 reference on the same rounded inputs."""
    q, k, v = qkv(dtype=dtype)
    out = flash_attention(q, k, v, causal=True)
    grad = torch.randn(out.shape).to(dtype).to("neuron")
    grads = torch.autograd.grad(out, (q, k, v), grad)
    assert out.dtype == dtype and all(gr.dtype == dtype for gr in grads)
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = reference(q32, k32, v32, causal=True)
    refs = torch.autograd.grad(ref, (q32, k32, v32), grad.float())
    torch.testing.assert_close(out.float().cpu(), ref.cpu(), rtol=tol, atol=tol)
    for got, want in zip(grads, refs):
        torch.testing.assert_close(got.float().cpu(), want.cpu(), rtol=tol, atol=2 * tol)


def test_dropout_uses_one_mask_in_forward_and_backward(eager, small_tiles):
    """The kernel's keep mask, rebuilt whole from its seed, given to the math path: outputs and
    gradients agree (1e-5); the same ``torch.manual_seed`` gives the same result."""
    q, k, v = qkv(h=4, hkv=2, t=24)
    p = 0.25
    torch.manual_seed(7)
    seed = int(fa_mod._draw_seed())
    torch.manual_seed(7)
    out = flash_attention(q, k, v, causal=True, dropout_p=p)
    torch.manual_seed(7)
    again = flash_attention(q, k, v, causal=True, dropout_p=p)
    assert torch.equal(out.cpu(), again.cpu())
    keep = attention_tiles.keep_mask(seed, p, 2, 4, 24, 24)
    assert abs(keep.float().mean().item() - (1 - p)) < 0.03
    grad = torch.randn(out.shape).to("neuron")
    got = torch.autograd.grad(out, (q, k, v), grad)
    ref = reference(q, k, v, causal=True, dropout_mask=keep.float().to("neuron"), p=p)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-5, atol=1e-5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-5, atol=1e-5)


def test_packed_variable_lengths_equal_each_sequence_alone(eager, small_tiles):
    lengths = [5, 17, 1, 30]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    q, k, v = qkv(b=1, h=4, hkv=2, t=sum(lengths))
    out = flash_attention(q, k, v, causal=True, cu_seqlens_q=cu.to("neuron"),
                          cu_seqlens_k=cu.to("neuron"))
    out.sum().backward()
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qs, ks, vs = (x.detach()[:, :, a:b].requires_grad_() for x in (q, k, v))
        alone = reference(qs, ks, vs, causal=True)
        alone.sum().backward()
        torch.testing.assert_close(out[:, :, a:b].detach().cpu(), alone.detach().cpu(),
                                   rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(q.grad[:, :, a:b].cpu(), qs.grad.cpu(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k.grad[:, :, a:b].cpu(), ks.grad.cpu(), rtol=1e-5, atol=1e-5)


def _host(*xs):
    return tuple(x.detach().cpu().double().requires_grad_() for x in xs)


@pytest.mark.parametrize("kw", [
    pytest.param(dict(causal=True), id="causal"),
    pytest.param(dict(causal=True, window=3), id="window"),
    pytest.param(dict(causal=False, scale=0.7), id="full-scale"),
])
def test_gradcheck_float64_on_the_host(small_tiles, kw):
    """The kernels' bodies on CPU float64 tensors (the host: the device has no float64, and
    a custom kernel's body is registered for the host executor too), GQA, several tiles."""
    q, k, v = _host(*qkv(b=1, h=4, hkv=2, t=19, d=4, device="cpu"))
    assert torch.autograd.gradcheck(lambda a, b, c: flash_attention(a, b, c, **kw), (q, k, v),
                                    fast_mode=True)


def test_full_gradcheck_on_a_tiny_shape(monkeypatch):
    """Full (not fast-mode) gradcheck: every Jacobian entry, 4 x 4 tiles over T = 9, GQA."""
    monkeypatch.setattr(fa_mod, "BLOCK_Q", 4)
    monkeypatch.setattr(fa_mod, "BLOCK_K", 4)
    q, k, v = _host(*qkv(b=1, h=2, hkv=1, t=9, d=3, device="cpu"))
    assert torch.autograd.gradcheck(
        lambda a, b, c: flash_attention(a, b, c, causal=True, window=6), (q, k, v))


def test_gradcheck_dropout_and_packed_on_the_host(small_tiles):
    q, k, v = _host(*qkv(b=1, h=2, hkv=1, t=14, d=4, device="cpu"))
    cu = torch.tensor([0, 6, 14])

    def fn(a, b, c):
        torch.manual_seed(3)          # one dropout mask for every evaluation
        return flash_attention(a, b, c, causal=True, dropout_p=0.3, cu_seqlens_q=cu,
                               cu_seqlens_k=cu)
    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)


def test_opcheck_on_the_device():
    q, k, v = (x.detach() for x in qkv(t=20))
    args = (q, k, v, None, None, None, 0.25, True, -1, 0.0, 16, 8)
    res = torch.library.opcheck(OPS.flash_attention_fwd.default, args)
    assert set(res.values()) == {"SUCCESS"}, res
    out, lse = OPS.flash_attention_fwd(*args)
    bargs = (torch.randn_like(out), q, k, v, out, lse, None, None, None, 0.25, True, -1, 0.0,
             16, 8)
    res = torch.library.opcheck(OPS.flash_attention_bwd.default, bargs)
    assert set(res.values()) == {"SUCCESS"}, res
    seeded = (q, k, v, None, None, torch.tensor(12345), 0.25, True, -1, 0.2, 16, 8)
    res = torch.library.opcheck(OPS.flash_attention_fwd.default, seeded)   # dropout: the seed
    assert set(res.values()) == {"SUCCESS"}, res                          # is an input


def test_adaptive_mode_equals_eager(small_tiles):
    """Adaptive mode without compiling replays the kernels per-op: bitwise eager's."""
    from neuron_lab.runtime import knobs
    q, k, v = qkv(t=24)
    results = {}
    for mode in ("eager", "adaptive"):
        with knobs.COMPILE.scoped(False), neuron_lab.mode(mode):
            for _ in range(3):                                   # adaptive: learnt, replayed
                out = flash_attention(q * 1, k, v, causal=True, window=7)
                g = torch.autograd.grad(out.sum(), (q, k, v))
                results[mode] = [out.detach().cpu()] + [x.cpu() for x in g]
    for a, b in zip(results["eager"], results["adaptive"]):
        assert torch.equal(a, b)


def test_under_torch_compile_forward_and_backward_are_one_node_each():
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    graphs = {"forward": [], "backward": []}

    def grab(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append([n.target for n in gm.graph.nodes if n.op == "call_function"])
            return make_boxed_func(gm.forward)
        return compiler

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=grab("forward"),
                                     bw_compiler=grab("backward"))

    q, k, v = qkv(t=20)
    torch._dynamo.reset()
    fn = torch.compile(lambda a, b, c: flash_attention(a * 2, b, c, causal=True).sum(),
                       backend=backend, fullgraph=True)
    loss = fn(q, k, v)
    loss.backward()
    ref = reference(q * 2, k, v, causal=True).sum()
    torch.testing.assert_close(loss.detach().cpu(), ref.detach().cpu(), rtol=1e-5, atol=1e-4)
    fwd, = graphs["forward"]
    bwd, = graphs["backward"]
    assert fwd.count(OPS.flash_attention_fwd.default) == 1
    assert bwd.count(OPS.flash_attention_bwd.default) == 1
    torch._dynamo.reset()


def test_compiled_dropout_draws_a_new_mask_per_call():
    q, k, v = qkv(t=20)
    torch._dynamo.reset()
    fn = torch.compile(lambda a, b, c: flash_attention(a, b, c, causal=True, dropout_p=0.3),
                       backend="aot_eager", fullgraph=True)
    first, second = fn(q, k, v), fn(q, k, v)
    assert not torch.equal(first.detach().cpu(), second.detach().cpu())
    (dq,) = torch.autograd.grad(first.sum(), (q,))
    assert dq.abs().sum().item() > 0
    torch._dynamo.reset()


def test_an_adaptive_fused_region_calls_the_kernel_as_an_opaque_node():
    """Adaptive mode, compiling: the region [mul, mul, flash_attention_fwd, add, mul] becomes
    one fused program calling the kernel between inductor's parts; results equal eager's
    (1e-6: inductor fuses the elementwise ops around it)."""
    from neuron_lab.runtime import knobs
    q, k, v = (x.detach() for x in qkv(t=20))
    with neuron_lab.mode("eager"):
        ref = ((flash_attention(q * 2, k * 1, v, causal=True) + 1) * 3).cpu()
    neuron_lab.runtime.reset()
    with knobs.SYNC_COMPILE.scoped(True), knobs.TRIALS.scoped(0), neuron_lab.mode("adaptive"):
        for _ in range(6):
            out = ((flash_attention(q * 2, k * 1, v, causal=True) + 1) * 3).cpu()
            torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
        stats = neuron_lab.runtime.stats()
        assert stats["launches_fused"] >= 1 and stats["compiles_failed"] == 0, stats
    neuron_lab.runtime.reset()


def test_errors_name_the_op_the_device_and_the_fix():
    q, k, v = (x.detach() for x in qkv(t=8))
    with pytest.raises(ValueError, match=r"flash_attention on neuron:0: .*not a multiple"):
        flash_attention(q[:, :3], k, v)
    with pytest.raises(ValueError, match=r"flash_attention on neuron:0: .*Fix: transpose"):
        flash_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match=r"dtypes differ"):
        flash_attention(q, k.half(), v)
    with pytest.raises(ValueError, match=r"window=0"):
        flash_attention(q, k, v, window=0)


def test_never_allocates_t_by_s_on_the_device(eager):
    """The tiled algorithm run on neuron tensors (every tile it allocates is counted by the
    device allocator) against sdpa's math path at T = 1024, batch 1, 8 heads, D 64, forward:
    the peak above the inputs stays under 1/8 of the math path's. (T = 4096 is the slow test
    ``test_memory_figure_at_4096``.)"""
    ratio = memory_ratio(1024)
    assert ratio["flash_tiles"] <= ratio["sdpa_math"] / 8, ratio


def memory_ratio(t: int, b: int = 1, h: int = 8, d: int = 64) -> dict:
    """Peak device bytes above the inputs: sdpa's math path, the tiled algorithm on device ops,
    and the kernel (whose tile workspace lives in the kernel body, off the device allocator)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d, generator=g).to("neuron") for _ in range(3))
    peaks = {}
    runs = {
        "sdpa_math": lambda: torch.ops.aten._scaled_dot_product_attention_math(
            q, k, v, is_causal=True)[0],
        "flash_tiles": lambda: attention_tiles.forward(
            q, k, v, 1 / math.sqrt(d), attention_tiles.Mask(True, -1, 0), None,
            fa_mod.BLOCK_Q, fa_mod.BLOCK_K)[0],
        "flash_kernel": lambda: flash_attention(q, k, v, causal=True),
    }
    for name, run in runs.items():
        neuron_lab.sync()
        base = torch.neuron.memory_allocated()
        torch.neuron.reset_peak_memory_stats()
        out = run()
        neuron_lab.sync()
        peaks[name] = torch.neuron.max_memory_allocated() - base
        del out
    return peaks


@pytest.mark.slow
def test_memory_figure_at_4096(eager):
    """The issue's figure: T = 4096, batch 1, 8 heads, D 64, float32, causal."""
    r = memory_ratio(4096)
    print({k: f"{v / 2**20:.1f} MiB" for k, v in r.items()},
          f"ratio {r['sdpa_math'] / r['flash_tiles']:.1f}x")
    assert r["flash_tiles"] <= r["sdpa_math"] / 8, r
    assert r["flash_kernel"] <= r["sdpa_math"] / 8, r

