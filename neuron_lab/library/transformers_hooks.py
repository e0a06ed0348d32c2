"""The library's kernels in Transformers' models, through Transformers' own extension points.

- ``attn_implementation="neuron_attention"``: ``AttentionInterface.register`` with
  ``flash_attention`` (the name must not contain "flash": Transformers v5 reads such names as hub
  kernels to download), and ``AttentionMaskInterface.register`` with Transformers' FlashAttention
  mask function: no 4-D mask is built; the model passes None (causal or sliding window, given as
  ``is_causal`` / ``sliding_window``) or its 2-D padding mask, which is unpadded into packed
  sequences (``cu_seqlens``) here, as Transformers does for FlashAttention-2. Packed sequences
  (``cu_seq_lens_q``/``cu_seq_lens_k`` keyword arguments, or position ids that restart at batch 1)
  run as packed sequences too.
- ``experts_implementation="neuron_moe"``: ``ExpertsInterface.register`` (the decorator
  ``@use_experts_implementation`` on Mixtral's and Qwen2-MoE's experts classes dispatches to it)
  with ``neuron_moe_experts_forward``: permute, grouped GEMM (gate/up), the model's own gate
  (``_apply_gate``), grouped GEMM (down), unpermute. The router stays the model's (softmax,
  top-k: the same math as ``moe.route``). ``config.neuron_moe_capacity_factor`` (optional) turns
  on capacity with token dropping; each experts module keeps its last call's accounting in
  ``neuron_moe_stats`` (routed and dropped assignments per expert).

``register()`` runs when ``transformers.modeling_utils`` is imported (``install()``, through
neuron_lab/after_import.py; at once if it is imported already), so neither order of imports needs a call
from the user.
"""
from __future__ import annotations

import warnings

import torch

from ..after_import import when_imported

ATTENTION = "neuron_attention"
EXPERTS = "neuron_moe"
_done = False


def _unpad(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B, H, L, D) rows where ``valid`` (B, L) -> (1, H, n, D)."""
    return x.transpose(1, 2)[valid].transpose(0, 1).unsqueeze(0)


def _cu(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(torch.cumsum(lengths, 0), (1, 0)).to(torch.int64)


def _packed_from_positions(position_ids, t: int):
    from transformers.modeling_flash_attention_utils import _is_packed_sequence
    if position_ids is None or torch.compiler.is_compiling() or position_ids.shape[-1] != t \
            or not bool(_is_packed_sequence(position_ids, 1)):
        return None
    pos = position_ids.reshape(-1)
    starts = (pos == pos.min()).nonzero().view(-1)
    return torch.cat([starts, torch.tensor([t], device=starts.device)]).to(torch.int64)


def neuron_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, is_causal: bool | None = None,
                             sliding_window: int | None = None, **kwargs):
    """Transformers' attention-function signature: q (B, H, T, D), k/v (B, Hkv, S, D) ->
    ((B, T, H, D), None)."""
    from .flash_attention import flash_attention
    for name in ("softcap", "s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(
                f"neuron_lab.library.flash_attention (attn_implementation={ATTENTION!r}) on "
                f"{query.device}: the model passes {name}, which the kernel does not implement. "
                "Fix: attn_implementation='sdpa' or 'eager' for this model")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = sliding_window if sliding_window else None
    b, h, t, d = query.shape
    s = key.shape[2]
    fa = dict(causal=bool(causal), window=window, scale=scaling, dropout_p=float(dropout))
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if attention_mask is not None and attention_mask.dim() == 4:
        raise NotImplementedError(
            f"neuron_lab.library.flash_attention (attn_implementation={ATTENTION!r}) on "
            f"{query.device}: got a 4-D attention mask (a custom mask pattern); the kernel takes "
            "causal / sliding-window rules and padding only. Fix: attn_implementation='sdpa'")
    if attention_mask is None and cu_q is None and b == 1 and t == s and t > 1:
        cu_q = cu_k = _packed_from_positions(kwargs.get("position_ids"), t)
    if attention_mask is None and cu_q is None:
        out = flash_attention(query, key, value, **fa)
        return out.transpose(1, 2).contiguous(), None
    if cu_q is not None:                                 # packed sequences, batch 1
        out = flash_attention(query, key, value, cu_seqlens_q=cu_q.long(),
                              cu_seqlens_k=cu_k.long(), **fa)
        return out.transpose(1, 2).contiguous(), None
    keys_ok = attention_mask[:, -s:].bool()             # 2-D padding mask (B, S)
    queries_ok = keys_ok[:, -t:]
    out = flash_attention(_unpad(query, queries_ok), _unpad(key, keys_ok),
                          _unpad(value, keys_ok), cu_seqlens_q=_cu(queries_ok.sum(-1)),
                          cu_seqlens_k=_cu(keys_ok.sum(-1)), **fa)
    full = out.new_zeros((b, t, h, out.shape[-1]))
    full[queries_ok] = out[0].transpose(0, 1)
    return full, None


def neuron_moe_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Transformers' experts-function signature (``self``: the experts module)."""
    from . import moe
    if getattr(self, "has_bias", False) or getattr(self, "has_post_expert_norm", False) \
            or getattr(self, "_is_expert_parallel", False):
        raise NotImplementedError(
            f"neuron_lab.library.moe (experts_implementation={EXPERTS!r}) on "
            f"{hidden_states.device}: {type(self).__name__} has expert biases, a post-expert "
            "norm or expert parallelism, which the kernels do not implement. Fix: "
            "experts_implementation='grouped_mm' or 'eager' for this model")
    w1 = self.gate_up_proj if getattr(self, "has_gate", True) else self.up_proj
    w2 = self.down_proj
    if getattr(self, "is_transposed", False):
        w1, w2 = w1.transpose(-1, -2), w2.transpose(-1, -2)
    factor = getattr(getattr(self, "config", None), "neuron_moe_capacity_factor", None)
    cap = None if factor is None else moe.capacity(hidden_states.shape[0], top_k_index.shape[-1],
                                                   self.num_experts, factor)
    p = moe.permute(hidden_states, top_k_index, self.num_experts, cap)
    h = moe.grouped_gemm(p.rows, w1, p.offsets)
    h = self._apply_gate(h) if getattr(self, "has_gate", True) else self.act_fn(h)
    y = moe.grouped_gemm(h, w2, p.offsets)
    self.neuron_moe_stats = {"routed": p.routed, "dropped": p.dropped}
    return moe.unpermute(y, p.perm, top_k_weights, p.offsets).to(hidden_states.dtype)


def register() -> None:
    """Register ``neuron_attention`` and ``neuron_moe`` with Transformers (idempotent)."""
    global _done
    if _done:
        return
    from transformers.modeling_utils import AttentionInterface
    from transformers.integrations.moe import ExpertsInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    AttentionInterface.register(ATTENTION, neuron_attention_forward)
    AttentionMaskInterface.register(ATTENTION, flash_attention_mask)
    ExpertsInterface.register(EXPERTS, neuron_moe_experts_forward)
    _done = True


def _register_quietly(_module) -> None:
    """Runs inside Transformers' own import: a failure here must not fail that import."""
    try:
        register()
    except Exception as e:                     # e.g. a Transformers without these interfaces
        warnings.warn(f"neuron_lab.library: could not register {ATTENTION!r}/{EXPERTS!r} with "
                      f"Transformers ({type(e).__name__}: {e}); needs transformers>=5.24",
                      RuntimeWarning, stacklevel=2)


def install() -> None:
    """Register now if Transformers' models are loaded, else as soon as they are."""
    when_imported("transformers.modeling_utils", _register_quietly)
