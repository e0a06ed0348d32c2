"""Mixture-of-experts as device kernels, one custom op per stage, each with its backward.

    route       logits (N, E)  -> weights (N, k) float32, expert ids (N, k)      softmax, top-k
    permute     hidden (N, D)  -> rows (N·k, D) grouped by expert, perm, offsets, counts, dropped
    grouped_gemm rows (M, K), w (E, N, K), offsets -> (M, N): rows of expert e times w[e]ᵀ
    unpermute   rows (N·k, D), perm, weights (N, k) -> (N, D): Σ_slots weight · row

``experts_mlp`` chains permute → grouped_gemm (gate/up) → activation → grouped_gemm (down) →
unpermute: the experts' MLP of Mixtral / Qwen2-MoE without a Python loop over experts and
without a (N, E) one-hot. transformers_hooks.py registers it as Transformers'
``experts_implementation="neuron_moe"``.

Capacity: with ``capacity`` C >= 0, an expert takes at most C of the (token, slot) assignments
routed to it, in token order; the rest are *dropped*: their rows are moved past
``offsets[-1]``, the grouped GEMM skips them (their rows are 0) and unpermute adds nothing for
them (a dropped slot contributes 0; its weight gets no gradient), as Switch/GShard's token
dropping does. ``permute`` returns per expert the assignments routed to it and the number
dropped (the accounting). All shapes are static (N·k rows, whatever is dropped), so the stages
trace under ``torch.compile`` and fit the adaptive runtime's regions; only the kernels' bodies
read offsets on the host.

Arithmetic: softmax and the unpermute sum in float32 (as Transformers does); the GEMMs in the
input dtype (the host's matmul accumulates 16-bit inputs in float32).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor

from ..device.custom_kernels import kernel


# --- route --------------------------------------------------------------------------------------

def _acc(dtype: torch.dtype) -> torch.dtype:
    """float32, or the input's dtype if wider (float64 on the host, for gradcheck)."""
    return torch.promote_types(dtype, torch.float32)


@kernel("neuron_lab::moe_route", mutates_args=())
def moe_route(logits: Tensor, top_k: int, renormalize: bool) -> tuple[Tensor, Tensor]:
    probs = torch.softmax(logits.to(_acc(logits.dtype)), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids


@moe_route.register_fake
def _(logits, top_k, renormalize):
    n = logits.shape[0]
    return (logits.new_empty((n, top_k), dtype=_acc(logits.dtype)),
            logits.new_empty((n, top_k), dtype=torch.int64))


@kernel("neuron_lab::moe_route_bwd", mutates_args=())
def moe_route_bwd(grad: Tensor, logits: Tensor, ids: Tensor, renormalize: bool) -> Tensor:
    probs = torch.softmax(logits.to(_acc(logits.dtype)), dim=-1)
    g = grad.to(probs.dtype)
    picked = probs.gather(-1, ids)
    if renormalize:                       # w = p / Z: dL/dp_s = (g_s - Σ_r g_r w_r) / Z
        z = picked.sum(-1, keepdim=True)
        g = (g - (g * picked / z).sum(-1, keepdim=True)) / z
    dprobs = torch.zeros_like(probs).scatter_add_(-1, ids, g)
    dlogits = probs * (dprobs - (dprobs * probs).sum(-1, keepdim=True))
    return dlogits.to(logits.dtype)


@moe_route_bwd.register_fake
def _(grad, logits, ids, renormalize):
    return logits.new_empty(logits.shape)


def _route_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], output[1])
    ctx.renormalize = inputs[2]


def _route_backward(ctx, grad_weights, _grad_ids):
    logits, ids = ctx.saved_tensors
    return moe_route_bwd(grad_weights.contiguous(), logits, ids, ctx.renormalize), None, None


moe_route.register_autograd(_route_backward, setup_context=_route_setup)


# --- permute ------------------------------------------------------------------------------------

@kernel("neuron_lab::moe_permute", mutates_args=())
def moe_permute(hidden: Tensor, expert_ids: Tensor, num_experts: int, capacity: int
                ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    flat = expert_ids.reshape(-1)
    order = torch.sort(flat, stable=True).indices          # (token, slot) pairs by expert
    sorted_ids = flat[order]
    routed = torch.bincount(flat, minlength=num_experts)[:num_experts]
    if capacity >= 0:
        starts = torch.cumsum(routed, 0) - routed
        rank = torch.arange(flat.numel(), device=flat.device) - starts[sorted_ids]
        kept = rank < capacity
        perm = torch.cat([order[kept], order[~kept]])
        kept_per = torch.clamp(routed, max=capacity)
    else:
        perm, kept_per = order, routed
    rows = hidden[perm // expert_ids.shape[-1]]
    n_kept = int(kept_per.sum())
    rows[n_kept:] = 0
    offsets = torch.cumsum(kept_per, 0).to(torch.int32)
    return rows, perm, offsets, routed, routed - kept_per


@moe_permute.register_fake
def _(hidden, expert_ids, num_experts, capacity):
    m = expert_ids.numel()
    return (hidden.new_empty((m, hidden.shape[-1])),
            hidden.new_empty((m,), dtype=torch.int64),
            hidden.new_empty((num_experts,), dtype=torch.int32),
            hidden.new_empty((num_experts,), dtype=torch.int64),
            hidden.new_empty((num_experts,), dtype=torch.int64))


@kernel("neuron_lab::moe_permute_bwd", mutates_args=())
def moe_permute_bwd(grad_rows: Tensor, perm: Tensor, offsets: Tensor, num_tokens: int,
                    top_k: int) -> Tensor:
    n_kept = int(offsets[-1]) if offsets.numel() else 0
    acc = _acc(grad_rows.dtype)
    out = torch.zeros((num_tokens, grad_rows.shape[-1]), dtype=acc, device=grad_rows.device)
    out.index_add_(0, perm[:n_kept] // top_k, grad_rows[:n_kept].to(acc))
    return out.to(grad_rows.dtype)


@moe_permute_bwd.register_fake
def _(grad_rows, perm, offsets, num_tokens, top_k):
    return grad_rows.new_empty((num_tokens, grad_rows.shape[-1]))


def _permute_setup(ctx, inputs, output):
    hidden, expert_ids = inputs[0], inputs[1]
    ctx.save_for_backward(output[1], output[2])
    ctx.shape = (hidden.shape[0], expert_ids.shape[-1])


def _permute_backward(ctx, grad_rows, *_):
    perm, offsets = ctx.saved_tensors
    return moe_permute_bwd(grad_rows.contiguous(), perm, offsets, *ctx.shape), None, None, None


moe_permute.register_autograd(_permute_backward, setup_context=_permute_setup)


# --- grouped GEMM -------------------------------------------------------------------------------

def _groups(offsets: Tensor):
    start = 0
    for e, end in enumerate(offsets.tolist()):
        if end > start:
            yield e, start, end
        start = end


@kernel("neuron_lab::grouped_gemm", mutates_args=())
def grouped_gemm(x: Tensor, w: Tensor, offsets: Tensor) -> Tensor:
    y = x.new_zeros((x.shape[0], w.shape[1]))
    for e, a, b in _groups(offsets):
        torch.mm(x[a:b], w[e].t(), out=y[a:b])
    return y


@grouped_gemm.register_fake
def _(x, w, offsets):
    return x.new_empty((x.shape[0], w.shape[1]))


@kernel("neuron_lab::grouped_gemm_bwd", mutates_args=())
def grouped_gemm_bwd(grad: Tensor, x: Tensor, w: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
    dx, dw = x.new_zeros(x.shape), w.new_zeros(w.shape)
    for e, a, b in _groups(offsets):
        torch.mm(grad[a:b], w[e], out=dx[a:b])
        dw[e] = grad[a:b].t() @ x[a:b]
    return dx, dw


@grouped_gemm_bwd.register_fake
def _(grad, x, w, offsets):
    return x.new_empty(x.shape), w.new_empty(w.shape)


def _gemm_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _gemm_backward(ctx, grad):
    x, w, offsets = ctx.saved_tensors
    dx, dw = grouped_gemm_bwd(grad.contiguous(), x, w, offsets)
    return dx, dw, None


grouped_gemm.register_autograd(_gemm_backward, setup_context=_gemm_setup)


# --- unpermute ----------------------------------------------------------------------------------

@kernel("neuron_lab::moe_unpermute", mutates_args=())
def moe_unpermute(rows: Tensor, perm: Tensor, weights: Tensor, offsets: Tensor) -> Tensor:
    n, k = weights.shape
    n_kept = int(offsets[-1]) if offsets.numel() else 0
    p = perm[:n_kept]
    out = torch.zeros((n, rows.shape[-1]), dtype=_acc(rows.dtype), device=rows.device)
    w = weights.reshape(-1)[p].to(out.dtype).unsqueeze(-1)
    out.index_add_(0, p // k, rows[:n_kept].to(out.dtype) * w)
    return out.to(rows.dtype)


@moe_unpermute.register_fake
def _(rows, perm, weights, offsets):
    return rows.new_empty((weights.shape[0], rows.shape[-1]))


@kernel("neuron_lab::moe_unpermute_bwd", mutates_args=())
def moe_unpermute_bwd(grad: Tensor, rows: Tensor, perm: Tensor, weights: Tensor, offsets: Tensor
                      ) -> tuple[Tensor, Tensor]:
    k = weights.shape[1]
    n_kept = int(offsets[-1]) if offsets.numel() else 0
    p = perm[:n_kept]
    acc = _acc(rows.dtype)
    g = grad.to(acc)[p // k]                                   # (kept, D)
    d_rows = rows.new_zeros(rows.shape)
    d_rows[:n_kept] = (g * weights.reshape(-1)[p].to(acc).unsqueeze(-1)).to(rows.dtype)
    d_w = torch.zeros(weights.numel(), dtype=acc, device=rows.device)
    d_w[p] = (g * rows[:n_kept].to(acc)).sum(-1)
    return d_rows, d_w.view(weights.shape).to(weights.dtype)


@moe_unpermute_bwd.register_fake
def _(grad, rows, perm, weights, offsets):
    return rows.new_empty(rows.shape), weights.new_empty(weights.shape)


def _unpermute_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _unpermute_backward(ctx, grad):
    rows, perm, weights, offsets = ctx.saved_tensors
    d_rows, d_w = moe_unpermute_bwd(grad.contiguous(), rows, perm, weights, offsets)
    return d_rows, None, d_w, None


moe_unpermute.register_autograd(_unpermute_backward, setup_context=_unpermute_setup)


# --- the public API -----------------------------------------------------------------------------

class Permuted(NamedTuple):
    """``permute``'s result: rows grouped by expert (kept rows first, then the dropped ones),
    ``perm`` (row -> token·k + slot), ``offsets`` (int32 cumulative kept rows per expert, as
    ``torch._grouped_mm`` takes them), ``routed`` and ``dropped`` per expert (int64)."""
    rows: Tensor
    perm: Tensor
    offsets: Tensor
    routed: Tensor
    dropped: Tensor


def _fail(msg: str, t: Tensor) -> ValueError:
    return ValueError(f"neuron_lab.library.moe on {t.device}: {msg}")


def route(logits: Tensor, top_k: int, renormalize: bool = True) -> tuple[Tensor, Tensor]:
    """Top-k routing: (weights float32 (N, k), expert ids int64 (N, k)) from router logits (N, E):
    softmax in float32, top-k, and with ``renormalize`` the k weights divided by their sum
    (Mixtral; Qwen2-MoE's ``norm_topk_prob``). Differentiable in ``logits``."""
    if logits.dim() != 2 or not 1 <= top_k <= logits.shape[-1]:
        raise _fail(f"route expects logits (tokens, experts) and 1 <= top_k <= experts; got "
                    f"{tuple(logits.shape)}, top_k={top_k}. Fix: flatten tokens to (N, E) and pick "
                    "top_k <= E", logits)
    return moe_route(logits, int(top_k), bool(renormalize))


def capacity(num_tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Switch Transformer's expert capacity: ceil(factor · tokens · k / experts)."""
    return int(math.ceil(capacity_factor * num_tokens * top_k / num_experts))


def permute(hidden: Tensor, expert_ids: Tensor, num_experts: int,
            capacity: int | None = None) -> Permuted:
    """Group the (token, slot) assignments by expert: ``hidden`` (N, D), ``expert_ids`` (N, k).
    With ``capacity``, each expert keeps at most that many (in token order), see module doc."""
    if hidden.dim() != 2 or expert_ids.dim() != 2 or expert_ids.shape[0] != hidden.shape[0]:
        raise _fail(f"permute expects hidden (tokens, dim) and expert_ids (tokens, k); got "
                    f"{tuple(hidden.shape)} and {tuple(expert_ids.shape)}. Fix: flatten tokens, "
                    "hidden.reshape(-1, dim), one row of expert ids per token", hidden)
    if expert_ids.dtype not in (torch.int64, torch.int32):
        raise _fail(f"expert_ids must be int32/int64, got {expert_ids.dtype}. Fix: "
                    "expert_ids.long()", hidden)
    return Permuted(*moe_permute(hidden, expert_ids.long(), int(num_experts),
                                 -1 if capacity is None else int(capacity)))


def unpermute(rows: Tensor, perm: Tensor, weights: Tensor, offsets: Tensor) -> Tensor:
    """(N, D): each token's kept rows, weighted by their routing weights and summed."""
    return moe_unpermute(rows, perm, weights, offsets)


def experts_mlp(hidden: Tensor, expert_ids: Tensor, weights: Tensor, w_gate_up: Tensor,
                w_down: Tensor, act: Callable[[Tensor], Tensor] = torch.nn.functional.silu,
                capacity: int | None = None, gate: Optional[Callable] = None
                ) -> tuple[Tensor, Permuted]:
    """The experts' gated MLP over routed tokens: per (token, slot) with expert e,
    ``down[e] · (act(gate) * up)`` where ``[gate; up] = gate_up[e] · x``, weighted and summed.
    ``w_gate_up`` (E, 2I, D), ``w_down`` (E, D, I) (Mixtral / Qwen2-MoE layout); ``gate``
    replaces ``act(gate) * up`` (given the (M, 2I) projection). Returns (out (N, D), Permuted)."""
    e = w_gate_up.shape[0]
    if w_down.shape[0] != e or w_gate_up.shape[-1] != hidden.shape[-1]:
        raise _fail(f"expert weights do not match: gate_up {tuple(w_gate_up.shape)}, down "
                    f"{tuple(w_down.shape)}, hidden {tuple(hidden.shape)}. Fix: gate_up "
                    "(E, 2I, D) and down (E, D, I) for hidden (N, D)", hidden)
    p = permute(hidden, expert_ids, e, capacity)
    h = grouped_gemm(p.rows, w_gate_up, p.offsets)
    if gate is not None:
        h = gate(h)
    else:
        g, u = h.chunk(2, dim=-1)
        h = act(g) * u
    y = grouped_gemm(h, w_down, p.offsets)
    return unpermute(y, p.perm, weights, p.offsets), p


def reference_experts(hidden: Tensor, expert_ids: Tensor, weights: Tensor, w_gate_up: Tensor,
                      w_down: Tensor, act=torch.nn.functional.silu) -> Tensor:
    """The oracle: a plain Python loop over experts and slots (no capacity)."""
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for e in range(w_gate_up.shape[0]):
        for s in range(expert_ids.shape[1]):
            tok = (expert_ids[:, s] == e).nonzero().flatten()
            if tok.numel() == 0:
                continue
            g, u = (hidden[tok] @ w_gate_up[e].t()).chunk(2, dim=-1)
            y = (act(g) * u) @ w_down[e].t()
            out = out.index_add(0, tok, y.float() * weights[tok, s, None].float())
    return out.to(hidden.dtype)
