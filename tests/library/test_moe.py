"""MoE kernels (issue 45, item 2): ``neuron_lab.library.moe``, one custom op per stage.

Oracles: ``moe.reference_experts`` (a plain Python loop over experts and slots) and Mixtral's
router written out with PyTorch ops. Tolerances at each comparison: float32 1e-5 (the grouped
GEMM and the weighted sum run in another order than the loop's).
"""
import pytest
import torch

import neuron_lab
from neuron_lab.library import moe

OPS = torch.ops.neuron_lab
N, D, I, E, K = 13, 8, 6, 5, 2


def data(device="neuron", dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(dtype).to(device).requires_grad_()  # noqa
    logits = torch.randn(N, E, generator=g).to(device)
    return mk(N, D), logits, mk(E, 2 * I, D), mk(E, D, I)


def router_reference(logits, k, renormalize):
    probs = torch.softmax(logits.float(), -1)
    w, ids = torch.topk(probs, k, -1)
    return (w / w.sum(-1, keepdim=True) if renormalize else w), ids


@pytest.mark.parametrize("renormalize", [True, False])
def test_route_matches_the_router_and_its_gradient(eager, renormalize):
    logits = torch.randn(N, E).to("neuron").requires_grad_()
    w, ids = moe.route(logits, K, renormalize)
    rw, rids = router_reference(logits, K, renormalize)
    assert torch.equal(ids.cpu(), rids.cpu())
    torch.testing.assert_close(w.cpu(), rw.cpu(), rtol=1e-6, atol=1e-6)
    g = torch.randn(N, K).to("neuron")
    got, = torch.autograd.grad(w, logits, g)
    want, = torch.autograd.grad(rw, logits, g)
    torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-5, atol=1e-6)


def test_experts_match_a_python_loop_over_experts(eager):
    x, logits, w1, w2 = data()
    weights, ids = moe.route(logits, K)
    out, p = moe.experts_mlp(x, ids, weights, w1, w2)
    ref = moe.reference_experts(x, ids, weights, w1, w2)
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-5, atol=1e-5)
    g = torch.randn(N, D).to("neuron")
    got = torch.autograd.grad(out, (x, w1, w2), g)
    want = torch.autograd.grad(ref, (x, w1, w2), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-5, atol=1e-5)
    counts = torch.bincount(ids.cpu().flatten(), minlength=E)
    assert torch.equal(p.routed.cpu(), counts) and int(p.dropped.sum()) == 0
    assert p.offsets.dtype == torch.int32 and int(p.offsets[-1]) == N * K
    ops = neuron_lab.executed_ops()
    for op in ("moe_route", "moe_permute", "grouped_gemm", "moe_unpermute", "moe_permute_bwd",
               "grouped_gemm_bwd", "moe_unpermute_bwd"):
        assert ops.get(f"neuron_lab::{op}", 0) >= 1, op


def test_capacity_drops_tokens_and_accounts_for_them(eager):
    """Capacity 2 per expert, every token to expert 0 in slot 0: expert 0 keeps tokens 0 and 1
    (token order) and drops the rest; a dropped slot adds nothing and its weight gets no
    gradient."""
    x = torch.randn(6, D).to("neuron").requires_grad_()
    ids = torch.tensor([[0, 1], [0, 2], [0, 1], [0, 3], [0, 1], [0, 1]]).to("neuron")
    weights = torch.full((6, 2), 0.5).to("neuron").requires_grad_()
    w1, w2 = torch.randn(4, 2 * I, D).to("neuron"), torch.randn(4, D, I).to("neuron")
    out, p = moe.experts_mlp(x, ids, weights, w1, w2, capacity=2)
    assert p.routed.cpu().tolist() == [6, 4, 1, 1]
    assert p.dropped.cpu().tolist() == [4, 2, 0, 0]
    assert p.offsets.cpu().tolist() == [2, 4, 5, 6]
    kept = torch.zeros(6, 2, dtype=torch.bool)
    kept[[0, 1], 0] = True
    kept[[0, 2], 1] = True
    kept[1, 1] = kept[3, 1] = True
    ref = moe.reference_experts(x, ids, weights * kept.to("neuron"), w1, w2)
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-5, atol=1e-5)
    dw, = torch.autograd.grad(out.sum(), weights)
    assert torch.all(dw.cpu()[~kept] == 0) and torch.all(dw.cpu()[kept] != 0)
    assert moe.capacity(num_tokens=6, top_k=2, num_experts=4, capacity_factor=1.0) == 3


def _host(*xs):
    return tuple(x.detach().cpu().double().requires_grad_() for x in xs)


def test_gradcheck_every_stage_float64_on_the_host():
    """Each kernel's body on CPU float64 (the host; the device has no float64)."""
    x, logits, w1, w2 = data(device="cpu")
    x, w1, w2 = _host(x, w1, w2)
    lg = logits.double().requires_grad_()
    assert torch.autograd.gradcheck(lambda a: moe.route(a, K)[0], (lg,))
    assert torch.autograd.gradcheck(lambda a: moe.route(a, K, False)[0], (lg,))
    weights, ids = moe.route(lg.detach(), K)
    weights = weights.double().requires_grad_()
    for cap in (None, 3):
        def fn(a, b, c, w):
            return moe.experts_mlp(a, ids, w, b, c, capacity=cap)[0]
        assert torch.autograd.gradcheck(fn, (x, w1, w2, weights), fast_mode=True)


def test_opcheck_each_stage_on_the_device():
    x, logits, w1, w2 = (t.detach() for t in data())
    weights, ids = moe.route(logits, K)
    p = moe.permute(x, ids, E)
    h = moe.grouped_gemm(p.rows, w1, p.offsets)
    calls = [
        (OPS.moe_route.default, (logits, K, True)),
        (OPS.moe_permute.default, (x, ids, E, 4)),
        (OPS.grouped_gemm.default, (p.rows, w1, p.offsets)),
        (OPS.moe_unpermute.default, (torch.randn(N * K, D).to("neuron"), p.perm, weights,
                                     p.offsets)),
        (OPS.moe_route_bwd.default, (torch.randn(N, K).to("neuron"), logits, ids, True)),
        (OPS.moe_permute_bwd.default, (p.rows, p.perm, p.offsets, N, K)),
        (OPS.grouped_gemm_bwd.default, (torch.randn_like(h), p.rows, w1, p.offsets)),
        (OPS.moe_unpermute_bwd.default, (torch.randn(N, D).to("neuron"), p.rows, p.perm,
                                         weights, p.offsets)),
    ]
    for op, args in calls:
        res = torch.library.opcheck(op, args)
        assert set(res.values()) == {"SUCCESS"}, (op, res)


def test_bfloat16_experts(eager):
    """bf16 weights and activations: within bf16 rounding (3e-2 relative to the output's scale)
    of the float32 loop on the same rounded values."""
    x, logits, w1, w2 = data(dtype=torch.bfloat16)
    weights, ids = moe.route(logits, K)
    out, _ = moe.experts_mlp(x, ids, weights, w1, w2)
    assert out.dtype == torch.bfloat16
    ref = moe.reference_experts(*(t.float() for t in (x, ids, weights, w1, w2)))
    scale = ref.abs().max().item()
    torch.testing.assert_close(out.float().cpu(), ref.cpu(), rtol=3e-2, atol=3e-2 * scale)


def test_errors_name_the_stage_and_the_device():
    x = torch.randn(4, D).to("neuron")
    with pytest.raises(ValueError, match=r"moe on neuron:0: permute expects"):
        moe.permute(x, torch.zeros(3, 2, dtype=torch.long).to("neuron"), E)
    with pytest.raises(ValueError, match=r"moe on neuron:0: route expects"):
        moe.route(torch.randn(4, 3).to("neuron"), 4)


def test_under_torch_compile_each_stage_is_one_node():
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    graphs = {"forward": [], "backward": []}

    def grab(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append([getattr(n.target, "_opname", None) for n in gm.graph.nodes
                                 if n.op == "call_function"])
            return make_boxed_func(gm.forward)
        return compiler

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=grab("forward"),
                                     bw_compiler=grab("backward"))

    x, logits, w1, w2 = data()
    weights, ids = (t.detach() for t in moe.route(logits, K))
    weights.requires_grad_()
    torch._dynamo.reset()
    fn = torch.compile(lambda *a: moe.experts_mlp(*a)[0], backend=backend, fullgraph=True)
    out = fn(x, ids, weights, w1, w2)
    out.sum().backward()
    ref = moe.reference_experts(x, ids, weights, w1, w2)
    torch.testing.assert_close(out.detach().cpu(), ref.detach().cpu(), rtol=1e-5, atol=1e-5)
    fwd, = graphs["forward"]
    bwd, = graphs["backward"]
    assert [fwd.count(n) for n in ("moe_permute", "grouped_gemm", "moe_unpermute")] == [1, 2, 1]
    assert [bwd.count(n) for n in ("moe_permute_bwd", "grouped_gemm_bwd",
                                   "moe_unpermute_bwd")] == [1, 2, 1]
    torch._dynamo.reset()


def test_adaptive_mode_equals_eager():
    """Adaptive mode without compiling replays the stages per-op: bitwise eager's."""
    from neuron_lab.runtime import knobs
    x, logits, w1, w2 = data()
    results = {}
    for mode in ("eager", "adaptive"):
        with knobs.COMPILE.scoped(False), neuron_lab.mode(mode):
            for _ in range(3):
                weights, ids = moe.route(logits * 1, K)
                out, _ = moe.experts_mlp(x * 1, ids, weights, w1, w2, capacity=6)
                grads = torch.autograd.grad(out.sum(), (x, w1, w2))
                results[mode] = [out.detach().cpu()] + [g.cpu() for g in grads]
    for a, b in zip(results["eager"], results["adaptive"]):
        assert torch.equal(a, b)
