"""The model zoo: Hugging Face Transformers architectures built from small configs (random
weights, no downloads), trained a few AdamW steps on CPU and on ``neuron``, compared.

Code nobody here wrote is the test: each architecture's own modeling file runs unchanged (GQA and
RoPE attention, tied embeddings, MoE routing with ``histc``, Mamba's selective scan, ViT patches,
encoder-decoder cross attention). ``run(name, mode)`` trains ``STEPS`` AdamW steps from the same
seed on CPU and on ``neuron`` in ``mode`` and compares every loss and every parameter after the
last step, then greedy ``generate()`` tokens (text models).

What "matches" means (``Verdict``):
- ``eager``, and ``adaptive`` with compiling off: the device runs CPU's kernels one by one, so
  losses and parameters are **bitwise** equal and the tokens identical.
- ``adaptive`` with fused programs (``compile=True``): inductor may reorder float32 arithmetic;
  losses within ``rtol=1e-4``; parameters within ``rtol=1e-3, atol=0.1*lr`` after 4 steps
  (AdamW's normalised update ``m/(sqrt(v)+eps)`` turns a last-bit difference in a near-zero
  gradient into a visible fraction of ``lr``: measured up to 2.4e-5 = 0.024*lr on GPT-2); tokens
  identical; and every region ran fused: one whose compile or fused run failed fell back to
  per-op (right results, the fused mode's speed lost) and fails the verdict (``failed_regions``).

``python -m neuron_lab.testing.compat`` runs the zoo into ``docs/compatibility.md``.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch

STEPS = 4
VOCAB = 96
SEQ = 12
BATCH = 2
LR = 1e-3
TOL = {"loss": dict(rtol=1e-4, atol=0.0), "param": dict(rtol=1e-3, atol=0.1 * LR)}


class Arch(NamedTuple):
    name: str           # the zoo's name for it
    family: str         # what it exercises (the compatibility table's second column)
    build: Callable     # () -> model, from a small config
    batch: Callable     # (device) -> training kwargs for model(**batch).loss
    generates: bool     # greedy generate() is compared


def _ids(n=SEQ, seed=1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (BATCH, n), generator=torch.Generator().manual_seed(seed))


def _lm_batch(dev):
    ids = _ids().to(dev)
    return {"input_ids": ids, "labels": ids}


def _s2s_batch(dev):
    return {"input_ids": _ids().to(dev), "labels": _ids(8, seed=2).to(dev)}


def _vit_batch(dev):
    g = torch.Generator().manual_seed(3)
    return {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g).to(dev),
            "labels": torch.tensor([1, 3]).to(dev)}


_DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _hf(cls_name: str, cfg_name: str, **kw) -> Callable:
    def build():
        import transformers
        cfg = getattr(transformers, cfg_name)(**kw)
        return getattr(transformers, cls_name)(cfg)
    return build


ARCHS: dict[str, Arch] = {a.name: a for a in [
    Arch("llama", "decoder, GQA + RoPE", _hf("LlamaForCausalLM", "LlamaConfig", **_DECODER),
         _lm_batch, True),
    Arch("qwen2", "decoder, GQA + RoPE, qkv bias",
         _hf("Qwen2ForCausalLM", "Qwen2Config", **_DECODER), _lm_batch, True),
    Arch("mistral", "decoder, GQA + RoPE, sliding window",
         _hf("MistralForCausalLM", "MistralConfig", sliding_window=8, **_DECODER), _lm_batch, True),
    Arch("gemma", "decoder, MQA + RoPE, tied head, scaled embedding",
         _hf("GemmaForCausalLM", "GemmaConfig", head_dim=8,
             **dict(_DECODER, num_key_value_heads=1)), _lm_batch, True),
    Arch("gpt2", "decoder, learned positions, tied head, Conv1D",
         _hf("GPT2LMHeadModel", "GPT2Config", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
             n_positions=64), _lm_batch, True),
    Arch("opt", "decoder, learned positions, tied head",
         _hf("OPTForCausalLM", "OPTConfig", vocab_size=VOCAB, hidden_size=32, ffn_dim=64,
             num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
             word_embed_proj_dim=32), _lm_batch, True),
    Arch("mixtral", "decoder, sparse MoE (int histc), GQA + RoPE",
         _hf("MixtralForCausalLM", "MixtralConfig", num_local_experts=4, num_experts_per_tok=2,
             output_router_logits=True, router_aux_loss_coef=0.02, **_DECODER), _lm_batch, True),
    Arch("qwen2_moe", "decoder, MoE + shared expert",
         _hf("Qwen2MoeForCausalLM", "Qwen2MoeConfig", num_experts=4, num_experts_per_tok=2,
             moe_intermediate_size=32, shared_expert_intermediate_size=48,
             output_router_logits=True, **_DECODER), _lm_batch, True),
    Arch("mamba", "state-space (selective scan, torch path)",
         _hf("MambaForCausalLM", "MambaConfig", vocab_size=VOCAB, hidden_size=32, state_size=8,
             num_hidden_layers=2, expand=2, conv_kernel=4), _lm_batch, True),
    Arch("bert", "encoder, masked LM, tied head",
         _hf("BertForMaskedLM", "BertConfig", vocab_size=VOCAB, hidden_size=32,
             num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=64), _lm_batch, False),
    Arch("roberta", "encoder, masked LM, tied head, padding-offset positions",
         _hf("RobertaForMaskedLM", "RobertaConfig", vocab_size=VOCAB, hidden_size=32,
             num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=64), _lm_batch, False),
    Arch("t5", "encoder-decoder, relative position bias",
         _hf("T5ForConditionalGeneration", "T5Config", vocab_size=VOCAB, d_model=32, d_kv=8,
             d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0), _s2s_batch, True),
    Arch("bart", "encoder-decoder, learned positions, tied head",
         _hf("BartForConditionalGeneration", "BartConfig", vocab_size=VOCAB, d_model=32,
             encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
             max_position_embeddings=64), _s2s_batch, True),
    Arch("vit", "vision transformer (patch conv), classification",
         _hf("ViTForImageClassification", "ViTConfig", image_size=16, patch_size=4,
             num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, num_labels=5), _vit_batch, False),
]}

# CI's default subset: one of each kind, chosen to cover GQA+RoPE, ties, MoE, seq2seq, vision
DEFAULT = ("llama", "gpt2", "mixtral", "t5", "bert", "vit")


@dataclass
class Trace:
    """One training run: per-step losses, final parameters (CPU), greedy tokens, seconds."""
    losses: list
    params: dict
    tokens: list | None
    n_params: int
    seconds: float


@dataclass
class Verdict:
    name: str
    mode: str
    ok: bool
    reason: str = ""                      # why not ok (the first mismatch), "" when ok
    loss_diff: float = 0.0                # max |loss_cpu - loss_neuron| over the steps
    param_diff: float = 0.0               # max |p_cpu - p_neuron| over all parameters
    tokens_equal: bool | None = None
    seconds: dict = field(default_factory=dict)


@contextlib.contextmanager
def device_mode(mode: str, compile: bool):
    """Run the neuron side in ``mode``; ``compile`` lets the adaptive runtime fuse (foreground
    compiles, compiled regions always run fused), else every op runs CPU's kernel."""
    import neuron_lab
    from neuron_lab import runtime
    from neuron_lab.runtime import knobs
    # a fresh region cache: programs compiled by an earlier fused run would otherwise keep
    # running fused in a later per-op run (the knob stops new compiles, not cached programs)
    runtime.reset()
    with contextlib.ExitStack() as st:
        st.enter_context(neuron_lab.mode("eager" if mode == "eager" else "adaptive"))
        st.enter_context(knobs.COMPILE.scoped(compile))
        if compile:
            st.enter_context(knobs.SYNC_COMPILE.scoped(True))   # deterministic: no race
            st.enter_context(knobs.TRIALS.scoped(0))            # compiled regions run fused
        yield


def train(arch: Arch, device: str, steps: int = STEPS, generate: bool = True) -> Trace:
    """``steps`` AdamW steps of ``arch`` on ``device`` from a fixed seed; then greedy tokens."""
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = arch.build()
    n_params = len(list(model.parameters()))
    model = model.to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    batch = arch.batch(device)
    losses = []
    for _ in range(steps):
        torch.manual_seed(1)               # dropout masks: the same draws on both devices
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    tokens = None
    if generate and arch.generates:
        model.eval()
        prompt = _ids(6, seed=4)[:1].to(device)
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=6, do_sample=False, min_new_tokens=6,
                                 pad_token_id=0)
        tokens = out.cpu().tolist()
    params = {k: v.detach().cpu() for k, v in model.named_parameters()}
    if device != "cpu":
        n_params = len(list(model.parameters()))     # after the move: ties must survive it
    return Trace(losses, params, tokens, n_params, time.perf_counter() - t0)


def compare(name: str, cpu: Trace, dev: Trace, mode: str, exact: bool) -> Verdict:
    """The verdict for one architecture in one mode: bitwise if ``exact``, else ``TOL``."""
    v = Verdict(name, mode, True, seconds={"cpu": round(cpu.seconds, 2),
                                           "neuron": round(dev.seconds, 2)})
    v.loss_diff = max(abs(a - b) for a, b in zip(cpu.losses, dev.losses))
    v.param_diff = max((cpu.params[k] - dev.params[k]).abs().max().item() for k in cpu.params)
    v.tokens_equal = None if cpu.tokens is None else cpu.tokens == dev.tokens
    problems = []
    if dev.n_params != cpu.n_params:
        problems.append(f"{cpu.n_params} parameters on CPU, {dev.n_params} on neuron (a tie broke)")
    for step, (a, b) in enumerate(zip(cpu.losses, dev.losses), 1):
        if not _close(torch.tensor(a), torch.tensor(b), exact, "loss"):
            problems.append(f"step {step} loss {b!r} != CPU {a!r}")
            break
    for k, p in cpu.params.items():
        if not _close(p, dev.params[k], exact, "param"):
            problems.append(f"parameter {k} differs by {(p - dev.params[k]).abs().max().item():.3g}")
            break
    if v.tokens_equal is False:
        problems.append(f"generate() tokens {dev.tokens} != CPU {cpu.tokens}")
    if problems:
        v.ok, v.reason = False, "; ".join(problems)
    return v


def _close(a: torch.Tensor, b: torch.Tensor, exact: bool, kind: str) -> bool:
    if exact:
        return torch.equal(a, b)
    return torch.allclose(a, b, equal_nan=True, **TOL[kind])


_cpu_cache: dict[str, Trace] = {}


def cpu_trace(name: str) -> Trace:
    """CPU's run of ``name`` (computed once per process: the reference for every mode)."""
    if name not in _cpu_cache:
        _cpu_cache[name] = train(ARCHS[name], "cpu")
    return _cpu_cache[name]


def run(name: str, mode: str, compile: bool = False) -> Verdict:
    """Train ``name`` on CPU and on ``neuron`` in ``mode``; compare. ``compile`` lets the
    adaptive runtime fuse (inductor; compared with ``TOL``), else every op runs CPU's kernel."""
    import neuron_lab
    cpu = cpu_trace(name)
    label = mode + ("+fused" if compile else "")
    try:
        with device_mode(mode, compile):
            dev = train(ARCHS[name], "neuron")
            neuron_lab.sync()
    except Exception as e:                              # the reason goes in the table
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return Verdict(name, label, False, f"{type(e).__name__}: {first[:300]}")
    v = compare(name, cpu, dev, label, exact=not compile)
    return with_failed_regions(v) if compile else v


def with_failed_regions(v: Verdict) -> Verdict:
    """``v``, failed if a region of the run failed (``failed_regions``), those listed."""
    unfused = failed_regions()
    if unfused:
        v.ok = False
        v.reason = "; ".join(filter(None, [v.reason, *unfused]))
    return v


def failed_regions() -> list[str]:
    """The regions whose compile or fused run failed, one line each: they fell back to per-op,
    so results stay right and the fused mode's speed is lost (a failed region is a bug)."""
    from neuron_lab import runtime
    return [f"region {r['id']} ({r['ops']} ops from {r['first_ops'][0]}) failed: "
            f"{(r['error'] or '').splitlines()[0][:160]}"
            for r in runtime.regions() if r["status"] == "failed"]
