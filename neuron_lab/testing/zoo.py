"""The model zoo: Hugging Face Transformers architectures built from small configs (random
weights, no downloads), trained a few AdamW steps on CPU and on ``neuron``, compared.

Code nobody here wrote is the test: each architecture's own modeling file runs unchanged (GQA and
RoPE attention, tied embeddings, MoE routing with ``histc``, Mamba's selective scan, ViT patches,
encoder-decoder cross attention). ``run(name, mode)`` trains ``STEPS`` (8) AdamW steps from the
same seed on CPU and on ``neuron`` in ``mode`` and compares every step's loss, every parameter's
update at every step (after - before), and every parameter after the last step, then greedy
``generate()`` tokens (text models).

What "matches" means (``Verdict``):
- ``eager``, and ``adaptive`` with compiling off: the device runs CPU's kernels one by one, so
  losses, updates and parameters are **bitwise** equal and the tokens identical.
- ``adaptive`` with fused programs (``compile=True``): inductor may reorder float32 arithmetic,
  so within ``TOL``: losses ``rtol=1e-4``; each parameter's update at each step within
  ``0.1*lr`` of CPU's (elementwise: AdamW's update is about ``lr`` per element, so an update
  missed or applied twice is off by about ``lr``, while a last-bit difference in a near-zero
  gradient, which AdamW's ``m/(sqrt(v)+eps)`` magnifies, stays a few percent of ``lr``);
  final parameters ``rtol=1e-3, atol=0.1*lr``; tokens identical. And the fused programs
  must have run (``FusedRun``): regions are compiled after ``FUSED_COMPILE_AFTER`` (1) hit, in
  the foreground, and run fused without an A/B trial, so every region of a step is fused from
  step ``FUSED_FROM`` (3) on; the share of ops that ran fused over steps ``FUSED_FROM``..``STEPS``
  (``runtime.stats()``: ``ops_fused / (ops_fused + ops_per_op)``) must be at least
  ``MIN_FUSED_SHARE`` (0.9); and no region may stay unfused after ``FUSED_COMPILE_AFTER`` hits
  (its compile or fused run failed, or it was never compiled) unless ``EXPECTED_UNFUSED`` lists
  the architecture with the reason (empty: every architecture fuses all of its regions).

``python -m neuron_lab.testing.compat`` runs the zoo into ``docs/compatibility.md``.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch

STEPS = 8
FUSED_FROM = 3                  # the first step whose regions all run fused (compile=True)
FUSED_COMPILE_AFTER = 1         # hits before a region is compiled (compile=True): the step-1
                                # region is hit at step 2, compiled after it, fused from step 3
MIN_FUSED_SHARE = 0.9           # of the ops of steps FUSED_FROM..STEPS (compile=True)
VOCAB = 96
SEQ = 12
BATCH = 2
LR = 1e-3
TOL = {"loss": dict(rtol=1e-4, atol=0.0), "param": dict(rtol=1e-3, atol=0.1 * LR),
       "update": dict(rtol=0.0, atol=0.1 * LR)}
# Architectures allowed to keep regions unfused in the fused mode, each with the reason; a
# listed architecture's fused share is not required either. Empty: every architecture's
# regions compile and run fused.
EXPECTED_UNFUSED: dict[str, str] = {}


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
# CI's subset with fused programs: a decoder, an encoder-decoder and an MoE
FUSED_DEFAULT = ("gpt2", "bart", "mixtral")


@dataclass
class Trace:
    """One training run: per-step losses, each step's parameter updates (after - before, CPU
    tensors), final parameters (CPU), greedy tokens, the ops that ran fused and per-op over
    steps ``FUSED_FROM``..``steps`` (0 on CPU), seconds."""
    losses: list
    params: dict
    tokens: list | None
    n_params: int
    seconds: float
    updates: list = field(default_factory=list)      # [{name: after - before}] per step
    ops_fused: int = 0
    ops_per_op: int = 0

    @property
    def fused_share(self) -> float:
        total = self.ops_fused + self.ops_per_op
        return self.ops_fused / total if total else 0.0


@dataclass
class Verdict:
    name: str
    mode: str
    ok: bool
    reason: str = ""                      # why not ok (the first mismatch), "" when ok
    loss_diff: float = 0.0                # max |loss_cpu - loss_neuron| over the steps
    param_diff: float = 0.0               # max |p_cpu - p_neuron| over all parameters
    update_diff: float = 0.0              # max |update_cpu - update_neuron| / lr, all steps
    tokens_equal: bool | None = None
    fused_share: float | None = None      # ops fused over steps FUSED_FROM..STEPS (fused mode)
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


def _snapshot(model) -> dict:
    return {k: v.detach().cpu().clone() for k, v in model.named_parameters()}


def _op_counts(device: str) -> tuple[int, int]:
    """The runtime's (ops fused, ops per-op) so far, its launches finished (a launch on the
    device's thread is counted when it has run); (0, 0) on CPU."""
    if device == "cpu":
        return 0, 0
    from neuron_lab import runtime
    runtime.sync()
    s = runtime.stats()
    return s["ops_fused"], s["ops_per_op"]


def train(arch: Arch, device: str, steps: int = STEPS, generate: bool = True) -> Trace:
    """``steps`` AdamW steps of ``arch`` on ``device`` from a fixed seed; then greedy tokens.
    The ops counted fused or per-op are those of steps ``FUSED_FROM``.. only, from the step's
    forward to its loss read (the parameter snapshots between steps are not counted)."""
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = arch.build()
    n_params = len(list(model.parameters()))
    model = model.to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    batch = arch.batch(device)
    losses, updates, fused_ops, per_op_ops = [], [], 0, 0
    before = _snapshot(model)
    for step in range(1, steps + 1):
        f0, p0 = _op_counts(device)
        torch.manual_seed(1)               # dropout masks: the same draws on both devices
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        f1, p1 = _op_counts(device)
        if step >= FUSED_FROM:
            fused_ops, per_op_ops = fused_ops + f1 - f0, per_op_ops + p1 - p0
        after = _snapshot(model)
        updates.append({k: after[k] - before[k] for k in after})
        before = after
    tokens = None
    if generate and arch.generates:
        model.eval()
        prompt = _ids(6, seed=4)[:1].to(device)
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=6, do_sample=False, min_new_tokens=6,
                                 pad_token_id=0)
        tokens = out.cpu().tolist()
    if device != "cpu":
        n_params = len(list(model.parameters()))     # after the move: ties must survive it
    return Trace(losses, before, tokens, n_params, time.perf_counter() - t0, updates,
                 fused_ops, per_op_ops)


def compare(name: str, cpu: Trace, dev: Trace, mode: str, exact: bool) -> Verdict:
    """The verdict for one architecture in one mode: bitwise if ``exact``, else ``TOL``."""
    v = Verdict(name, mode, True, seconds={"cpu": round(cpu.seconds, 2),
                                           "neuron": round(dev.seconds, 2)})
    v.loss_diff = max(abs(a - b) for a, b in zip(cpu.losses, dev.losses))
    v.param_diff = max((cpu.params[k] - dev.params[k]).abs().max().item() for k in cpu.params)
    v.update_diff = max(((a[k] - b[k]).abs().max().item() / LR
                         for a, b in zip(cpu.updates, dev.updates) for k in a), default=0.0)
    v.tokens_equal = None if cpu.tokens is None else cpu.tokens == dev.tokens
    problems = []
    if dev.n_params != cpu.n_params:
        problems.append(f"{cpu.n_params} parameters on CPU, {dev.n_params} on neuron (a tie broke)")
    if len(dev.updates) != len(cpu.updates):
        problems.append(f"{len(dev.updates)} steps on neuron, {len(cpu.updates)} on CPU")
    for step, (a, b) in enumerate(zip(cpu.losses, dev.losses), 1):
        if not _close(torch.tensor(a), torch.tensor(b), exact, "loss"):
            problems.append(f"step {step} loss {b!r} != CPU {a!r}")
            break
    problems += _first_update_mismatch(cpu.updates, dev.updates, exact)
    for k, p in cpu.params.items():
        if not _close(p, dev.params[k], exact, "param"):
            problems.append(f"parameter {k} differs by {(p - dev.params[k]).abs().max().item():.3g}")
            break
    if v.tokens_equal is False:
        problems.append(f"generate() tokens {dev.tokens} != CPU {cpu.tokens}")
    if problems:
        v.ok, v.reason = False, "; ".join(problems)
    return v


def _first_update_mismatch(cpu: list, dev: list, exact: bool) -> list[str]:
    """The first step's parameter whose update (after - before) is not CPU's, as one line."""
    for step, (a, b) in enumerate(zip(cpu, dev), 1):
        for k, u in a.items():
            if not _close(u, b[k], exact, "update"):
                return [f"step {step} update of {k} differs from CPU's by "
                        f"{(u - b[k]).abs().max().item() / LR:.3g}*lr "
                        f"(CPU's is up to {u.abs().max().item() / LR:.3g}*lr)"]
    return []


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
    adaptive runtime fuse (inductor; compared with ``TOL``, and the fused programs must have
    run: ``fused_run_problems``), else every op runs CPU's kernel."""
    import neuron_lab
    from neuron_lab.runtime import knobs
    cpu = cpu_trace(name)
    label = mode + ("+fused" if compile else "")
    try:
        with device_mode(mode, compile), knobs.COMPILE_AFTER.scoped(
                FUSED_COMPILE_AFTER if compile else knobs.COMPILE_AFTER.get()):
            dev = train(ARCHS[name], "neuron")
            neuron_lab.sync()
    except Exception as e:                              # the reason goes in the table
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return Verdict(name, label, False, f"{type(e).__name__}: {first[:300]}")
    v = compare(name, cpu, dev, label, exact=not compile)
    if not compile:
        return v
    v.fused_share = dev.fused_share
    return failing(v, fused_run_problems(name, dev))


def fused_run_problems(name: str, dev: Trace) -> list[str]:
    """Why the fused mode's programs did not run as they must, one line each: a region that
    failed (always), one left unfused after its compile (``unfused_regions``), and a fused share
    under ``MIN_FUSED_SHARE`` (both unless ``EXPECTED_UNFUSED`` lists ``name``)."""
    problems = failed_regions()
    if name in EXPECTED_UNFUSED:
        return problems
    problems += unfused_regions()
    if dev.fused_share < MIN_FUSED_SHARE:
        problems.append(f"fused share {dev.fused_share:.2f} < {MIN_FUSED_SHARE} over steps "
                        f"{FUSED_FROM}-{len(dev.losses)} ({dev.ops_fused} of "
                        f"{dev.ops_fused + dev.ops_per_op} ops fused)")
    return problems


def failing(v: Verdict, problems: list[str]) -> Verdict:
    """``v``, failed with ``problems`` added to its reason (unchanged if there are none)."""
    if problems:
        v.ok = False
        v.reason = "; ".join(filter(None, [v.reason, *problems]))
    return v


def with_failed_regions(v: Verdict) -> Verdict:
    """``v``, failed if a region of the run failed (``failed_regions``), those listed."""
    return failing(v, failed_regions())


def _region_line(r: dict, what: str) -> str:
    return f"region {r['id']} ({r['ops']} ops from {r['first_ops'][0]}) {what}"


def failed_regions() -> list[str]:
    """The regions whose compile or fused run failed, one line each: they fell back to per-op,
    so results stay right and the fused mode's speed is lost (a failed region is a bug)."""
    from neuron_lab import runtime
    return [_region_line(r, "failed: " + (r["error"] or "").splitlines()[0][:160])
            for r in runtime.regions() if r["status"] == "failed"]


def unfused_regions() -> list[str]:
    """The regions long enough to compile (``NEURON_LAB_MIN_REGION_OPS``) and launched again
    after the ``FUSED_COMPILE_AFTER``-th hit, whose compile followed, that are not ``fused``
    (failed ones: ``failed_regions``), one line each: with foreground compiles and no trials
    every such region is."""
    from neuron_lab import runtime
    from neuron_lab.runtime import knobs
    return [_region_line(r, f"is {r['status']} after {r['hits']} hits "
                            f"({r['fused_launches']} fused launches)")
            for r in runtime.regions()
            if r["status"] not in ("fused", "failed") and r["hits"] > FUSED_COMPILE_AFTER
            and r["ops"] >= knobs.MIN_REGION_OPS.get()]
