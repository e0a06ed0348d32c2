"""Real models compiled on neuron against CPU eager: Transformers models built from config (no
downloads) forward+backward, static-cache generate, FlexAttention with a causal score_mod.

Tolerances: logits/loss rtol 1e-4, atol 1e-5 (inductor fuses and reorders float32 reductions);
gradients atol 1e-5; greedy tokens exactly."""
import copy

import pytest
import torch

import neuron_lab
from neuron_lab.compile import outcomes

transformers = pytest.importorskip("transformers")


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


def _bert():
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  max_position_embeddings=64, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return transformers.BertForMaskedLM(cfg)


def _t5():
    cfg = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                num_heads=4, dropout_rate=0.0, decoder_start_token_id=0)
    return transformers.T5ForConditionalGeneration(cfg)


def _fwd_bwd_matches(make, labels_len=None):
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    labels = ids if labels_len is None else ids[:, :labels_len].contiguous()
    ref_model = copy.deepcopy(model)
    ref = ref_model(input_ids=ids, labels=labels)
    ref.loss.backward()
    outcomes.clear()
    dev_model = model.to("neuron")
    out = torch.compile(dev_model, backend="neuron")(input_ids=ids.to("neuron"),
                                                      labels=labels.to("neuron"))
    out.loss.backward()
    snap = outcomes.snapshot()
    assert snap["failures"] == 0, snap["recent_failures"]
    assert snap["programs_by_kind"].get("forward", 0) >= 1
    assert snap["programs_by_kind"].get("backward", 0) >= 1
    torch.testing.assert_close(out.loss.cpu(), ref.loss, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.logits.detach().cpu(), ref.logits.detach(), rtol=1e-4, atol=1e-5)
    grads = dict(ref_model.named_parameters())
    for name, p in dev_model.named_parameters():
        if grads[name].grad is not None:
            torch.testing.assert_close(p.grad.cpu(), grads[name].grad, rtol=1e-4, atol=1e-5,
                                       msg=name)


def test_llama_compiled_forward_backward_matches_cpu():
    _fwd_bwd_matches(_llama)


@pytest.mark.slow
def test_bert_compiled_forward_backward_matches_cpu():
    _fwd_bwd_matches(_bert)


@pytest.mark.slow
def test_t5_compiled_forward_backward_matches_cpu():
    _fwd_bwd_matches(_t5, labels_len=7)


def test_static_cache_generate_gives_cpu_tokens():
    """Transformers compiles the decoding step itself for a static cache on any non-CPU
    device, with torch.compile's default backend: the graph reaches the neuron pipeline."""
    torch.manual_seed(0)
    model = _llama().eval()
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(2))
    ref = model.generate(ids, max_new_tokens=8, do_sample=False, cache_implementation="static")
    outcomes.clear()
    out = model.to("neuron").generate(ids.to("neuron"), max_new_tokens=8, do_sample=False,
                                      cache_implementation="static")
    assert out.cpu().tolist() == ref.tolist()
    snap = outcomes.snapshot()
    assert snap["programs"] >= 1 and snap["failures"] == 0, snap


def _causal(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


def test_flex_attention_with_a_causal_score_mod_matches():
    from torch.nn.attention.flex_attention import flex_attention
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 16, 16, generator=g) for _ in range(3))
    ref = flex_attention(q, k, v, score_mod=_causal)        # CPU eager (its reference path)
    outcomes.clear()
    f = torch.compile(flex_attention, backend="neuron")
    out = f(q.to("neuron"), k.to("neuron"), v.to("neuron"), score_mod=_causal)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out.cpu(), sdpa, rtol=1e-5, atol=1e-5)
    snap = outcomes.snapshot()
    assert snap["programs"] == 1 and snap["graph_breaks"] == 0 and snap["failures"] == 0, snap


def test_flex_attention_backward_runs_on_the_device_kernel():
    """Issue 43: the device provides the backward the CPU executor lacks
    (tests/compile/test_flex_device.py covers the matrix)."""
    from torch._higher_order_ops.flex_attention import math_attention
    from torch.nn.attention.flex_attention import flex_attention, noop_mask
    q = torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    qn = q.to("neuron").requires_grad_()
    flex_attention(qn, qn.detach(), qn.detach(), score_mod=_causal).sum().backward()
    qc = q.clone().requires_grad_()
    ref = math_attention(qc, q, q, _causal, (8, 8, *[None] * 12, 8, 8, noop_mask),
                         8 ** -0.5, {})[0]
    ref.sum().backward()
    torch.testing.assert_close(qn.grad.cpu(), qc.grad, rtol=1e-5, atol=1e-5)
