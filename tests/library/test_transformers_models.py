"""The kernels in Transformers' models, unedited (issue 45, item 3).

``attn_implementation="neuron_attention"`` and ``experts_implementation="neuron_moe"`` on tiny
Mixtral and Qwen2-MoE configs, on ``neuron``, against the reference path: the same model on CPU
with ``sdpa`` attention and the ``eager`` experts (Transformers' Python loop over experts), same
initial weights and data, 8 AdamW steps. Tolerance (float32): losses within 1e-5 relative and
final weights within 5e-5 absolute + 1e-4 relative; the kernels sum in another order than the
reference (tiles, grouped GEMMs) and AdamW's division by sqrt(v) amplifies last-bit differences
(measured: weights within 5e-6).

Default run: Mixtral in eager mode. The full matrix (both models × eager, adaptive, compiled)
is ``slow``; ``adaptive`` runs with background compiling off (regions replayed per-op, as
tests/device does), ``adaptive-fused`` compiles each learnt region at once and runs it fused
(the kernels are opaque calls inside inductor's programs), ``compiled`` is
``torch.compile(model, backend="neuron")`` in adaptive mode.
"""
import contextlib

import pytest
import torch

import neuron_lab
import neuron_lab.library  # noqa: F401  (registers the names with Transformers)
from neuron_lab.runtime import knobs

transformers = pytest.importorskip("transformers")

VOCAB, STEPS = 64, 8
KERNELS = ("neuron_lab::flash_attention_fwd", "neuron_lab::flash_attention_bwd",
           "neuron_lab::moe_permute", "neuron_lab::grouped_gemm", "neuron_lab::moe_unpermute",
           "neuron_lab::grouped_gemm_bwd", "neuron_lab::moe_unpermute_bwd")
DYNAMO_NODES = {"flash_attention_fwd", "moe_permute", "grouped_gemm", "moe_unpermute"}


def config(kind: str):
    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, num_experts_per_tok=2, max_position_embeddings=64)
    if kind == "mixtral":
        return transformers.MixtralConfig(intermediate_size=48, num_local_experts=4,
                                          sliding_window=None, **common)
    return transformers.Qwen2MoeConfig(intermediate_size=48, moe_intermediate_size=24,
                                       shared_expert_intermediate_size=48, num_experts=4,
                                       norm_topk_prob=False, **common)


def build(kind, attn, experts):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(
        config(kind), attn_implementation=attn, experts_implementation=experts)


def train(model, device, compile_backend=None, graphs=None):
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, VOCAB, (2, 16), generator=g) for _ in range(STEPS)]
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fwd = model
    if compile_backend is not None:
        inner = torch._dynamo.lookup_backend(compile_backend)

        def backend(gm, example_inputs):
            graphs.append({getattr(n.target, "_opname", str(n.target)) for n in gm.graph.nodes
                           if n.op == "call_function"})
            return inner(gm, example_inputs)
        fwd = torch.compile(model, backend=backend)
    losses = []
    for x in data:
        x = x.to(device)
        loss = fwd(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


_refs: dict = {}


def reference(kind):
    if kind not in _refs:
        _refs[kind] = train(build(kind, "sdpa", "eager"), "cpu")
    return _refs[kind]


def check(kind, mode, compiled=False, fused=False):
    ref_losses, ref_state = reference(kind)
    model = build(kind, "neuron_attention", "neuron_moe")
    assert model.config._attn_implementation == "neuron_attention"
    assert model.config._experts_implementation == "neuron_moe"
    neuron_lab.clear_op_tracking()
    graphs: list = []
    torch._dynamo.reset()
    with contextlib.ExitStack() as stack:
        if fused:      # adaptive regions compiled at once and run fused from their next hit
            neuron_lab.runtime.reset()
            stack.enter_context(knobs.SYNC_COMPILE.scoped(True))
            stack.enter_context(knobs.TRIALS.scoped(0))
        else:
            stack.enter_context(knobs.COMPILE.scoped(False))
        stack.enter_context(neuron_lab.mode(mode))
        losses, state = train(model, "neuron", "neuron" if compiled else None, graphs)
        stats = neuron_lab.runtime.stats()
    torch._dynamo.reset()
    if fused:
        assert stats["launches_fused"] > 0 and stats["compiles_failed"] == 0, stats
    assert losses == pytest.approx(ref_losses, rel=1e-5), (losses, ref_losses)
    for k, v in ref_state.items():
        torch.testing.assert_close(state[k], v, rtol=1e-4, atol=5e-5, msg=k)
    if compiled:
        seen = set().union(*graphs)
        assert DYNAMO_NODES <= seen, seen
    else:
        ops = neuron_lab.executed_ops()
        for op in KERNELS:
            assert ops.get(op, 0) >= STEPS, (op, ops.get(op))


def test_mixtral_trains_like_the_reference_eager():
    check("mixtral", "eager")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
@pytest.mark.parametrize("mode,compiled,fused", [("eager", False, False),
                                                 ("adaptive", False, False),
                                                 ("adaptive", False, True),
                                                 ("adaptive", True, False)],
                         ids=["eager", "adaptive", "adaptive-fused", "compiled"])
def test_models_train_like_the_reference(kind, mode, compiled, fused):
    check(kind, mode, compiled, fused)


def test_padding_mask_is_unpadded_into_packed_sequences(eager):
    """A left-padded batch: at the real tokens, logits equal the sdpa reference's (1e-5)."""
    ref = build("mixtral", "sdpa", "eager").eval()
    model = build("mixtral", "neuron_attention", "neuron_moe").eval().to("neuron")
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :5] = 0
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        got = model(input_ids=ids.to("neuron"), attention_mask=mask.to("neuron")).logits.cpu()
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)


def test_a_4d_mask_is_refused_with_the_fix():
    from neuron_lab.library.transformers_hooks import neuron_attention_forward
    q = torch.randn(1, 2, 4, 8).to("neuron")
    with pytest.raises(NotImplementedError, match="neuron_attention.*4-D attention mask.*sdpa"):
        neuron_attention_forward(None, q, q, q, torch.ones(1, 1, 4, 4).to("neuron"))


def _forward_both(cfg_changes: dict, **inputs):
    cfg = config("mixtral")
    for k, v in cfg_changes.items():
        setattr(cfg, k, v)
    outs = []
    for attn, experts, device in (("sdpa", "eager", "cpu"),
                                  ("neuron_attention", "neuron_moe", "neuron")):
        torch.manual_seed(0)
        m = transformers.AutoModelForCausalLM.from_config(
            cfg, attn_implementation=attn, experts_implementation=experts).eval().to(device)
        with torch.no_grad():
            outs.append(m(**{k: v.to(device) for k, v in inputs.items()}).logits.cpu())
    return outs


def test_sliding_window_matches_sdpa(eager):
    """Mixtral with ``sliding_window=5`` at T = 16: the kernel's window rule is Transformers'."""
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(3))
    want, got = _forward_both({"sliding_window": 5}, input_ids=ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_packed_sequences_from_position_ids_equal_each_document_alone(eager):
    """Three documents packed in one row, marked by position ids that restart (as
    Transformers' FlashAttention path reads them): each attends to itself only, so the logits
    equal the sdpa reference run on each document alone (1e-5). (This model's sdpa path, given
    the packed row, does not separate them.)"""
    ids = torch.randint(0, VOCAB, (1, 15), generator=torch.Generator().manual_seed(4))
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6]])
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(config("mixtral"),
                                                        attn_implementation="sdpa").eval()
    with torch.no_grad():
        want = torch.cat([ref(input_ids=ids[:, a:b]).logits for a, b in ((0, 5), (5, 8), (8, 15))],
                         1)
    _, got = _forward_both({}, input_ids=ids, position_ids=pos)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_bfloat16_training_tracks_the_reference(kind):
    """bf16 weights and activations, 4 AdamW steps, eager: losses within 1e-3 relative of the
    CPU bf16 reference (bf16 rounding of differently ordered sums; measured ~3e-5)."""
    results = {}
    for attn, experts, device in (("sdpa", "eager", "cpu"),
                                  ("neuron_attention", "neuron_moe", "neuron")):
        torch.manual_seed(0)
        m = transformers.AutoModelForCausalLM.from_config(
            config(kind), attn_implementation=attn, experts_implementation=experts,
            dtype=torch.bfloat16).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        losses = []
        with neuron_lab.mode("eager"):
            for _ in range(4):
                x = torch.randint(0, VOCAB, (2, 16), generator=g).to(device)
                loss = m(input_ids=x, labels=x).loss
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        results[device] = losses
    assert results["neuron"] == pytest.approx(results["cpu"], rel=1e-3)


@pytest.mark.slow
def test_registration_waits_for_transformers_to_be_imported():
    """``import neuron_lab.library`` before Transformers: the names are registered when
    Transformers' models load (an import hook), in a fresh interpreter (~20 s of imports; the
    default run's tutorial 11 imports in this order too)."""
    import subprocess
    import sys
    code = ("import sys, neuron_lab.library\n"
            "assert 'transformers.modeling_utils' not in sys.modules\n"
            "from transformers import AttentionInterface\n"
            "from transformers.integrations.moe import ExpertsInterface\n"
            "assert 'neuron_attention' in AttentionInterface._global_mapping\n"
            "assert 'neuron_moe' in ExpertsInterface._global_mapping\n"
            "print('registered')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and "registered" in res.stdout, res.stderr[-2000:]
