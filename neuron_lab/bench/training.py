"""Training workloads: an MLP (W3), a tiny GPT (W4) and a Transformers Llama (W6) train step,
all with AdamW.

One iteration = ``zero_grad``, forward, cross-entropy, ``backward``, ``AdamW.step``, then the
peer's step boundary (``mark_step`` for lazy). Steps do not sync one by one (a training loop
does not look at every loss); each timed sample ends with the peer's ``sync()``, inside the
window, so queued work is paid for. Steady state (steps/s) follows the harness's warm-up rules.

W4 also measures what a user sees from a fresh model, *without* waiting for background compiles:
``first_step_s`` — from the first ``train_step`` call until its loss is on the host (``.item()``),
on a fresh model (and, adaptive, an empty region cache: ``peer.fresh_sampling()``) each time:
``cfg.first_step_repeats`` samples (5; 2 with ``--quick``) for the peers whose first step is
repeatable in one process, taken after every peer's set-up and interleaved across peers like
the steady samples (``harness.Fresh``); one for torch.compile and torch._lazy (their in-process
compile caches make a second fresh model cheaper than a first), the first step of the run below;
``total_s`` — from the same start until step N's loss is on the host (N = 200, 10 with
``--quick``), compiles included (torch.compile's happen inside the first step; the adaptive
runtime's in a background thread that competes for the same 2 cores); that is a single
measurement, so it carries one sample. A peer still short of N
steps after ``cfg.fresh_budget_s`` (120 s; torch._lazy re-traces every step) stops there and
the rest is extrapolated from its mean step time after the first; the JSON's ``fresh_run``
records ``steps_run`` and ``measured_s`` when that happened. Those two are single
measurement (a fresh model and a fresh region cache), so it carries one sample.
"""
from __future__ import annotations

from . import models
from .harness import Fresh, Metric, Ratio, Skip, Workload, perf, steady


def _loop(peer, model, opt, batch):
    x, y = batch

    def it():
        loss = models.train_step(model, opt, x, y)
        peer.step_end()
        return loss
    return it


def run_w3(peer, cfg) -> dict:
    it = _loop(peer, *models.make("mlp", peer))
    return {"steady": steady(it, peer, cfg, end=peer.sync, steps_per_s=lambda t: 1.0 / t),
            "extra": peer.extra}


def run_w6(peer, cfg) -> dict:
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise Skip(f"needs Transformers (pip install neuron_lab[bench]): {e}") from None
    it = _loop(peer, *models.make("llama", peer))
    return {"steady": steady(it, peer, cfg, end=peer.sync, steps_per_s=lambda t: 1.0 / t),
            "extra": peer.extra}


def _first_step(peer) -> float:
    """Seconds from a fresh model's first ``train_step`` call until its loss is on the host."""
    it = _loop(peer, *models.make("gpt", peer))
    t0 = perf()
    it().item()
    return perf() - t0


def run_w4(peer, cfg) -> dict:
    steps = cfg.fresh_steps
    it = _loop(peer, *models.make("gpt", peer))
    t0 = perf()
    first_loss = it().item()
    first = perf() - t0
    done, loss = 1, None
    while done < steps and (perf() - t0 < cfg.fresh_budget_s or done < 3):
        loss = it()
        done += 1
    last_loss = loss.item() if loss is not None else first_loss
    total = perf() - t0
    fresh = {"steps": steps, "steps_run": done, "first_loss": first_loss, "last_loss": last_loss}
    if done < steps:    # too slow for the budget: extrapolate from the steps after the first
        fresh["measured_s"] = total
        total += (steps - done) * (total - first) / (done - 1)
    fresh.update(peer.extra())
    return {"steady": steady(it, peer, cfg, end=peer.sync, steps_per_s=lambda t: 1.0 / t),
            "first_step_s": (Fresh(lambda: _first_step(peer), cfg.first_step_repeats)
                             if peer.fresh_repeatable else [first]),
            "total_s": total,
            "extra": lambda: {"fresh_run": fresh, "steady": peer.extra()}}


W3 = Workload(
    "W3", "MLP 256-512-512-10, batch 128, AdamW train step",
    [Metric("steps_per_s", "steps/s", "higher")], run_w3,
    [Ratio("W3 adaptive / CPU eager steps/s", ("steps_per_s", "neuron_adaptive"), ("steps_per_s", "native"), ">=", 1.3),
     Ratio("W3 adaptive / torch.compile steps/s", ("steps_per_s", "neuron_adaptive"), ("steps_per_s", "compile"), ">=", 1.0),
     Ratio("W3 neuron compiled / torch.compile steps/s", ("steps_per_s", "neuron_compile"), ("steps_per_s", "compile"), ">=", 0.95)])

W4 = Workload(
    "W4", "tiny GPT (2 layers, d=128, T=64, batch 16) AdamW train step",
    [Metric("steps_per_s", "steps/s", "higher"),
     Metric("first_step_s", "s to first step", "lower", log=True),
     Metric("total_s", "s to N steps", "lower", log=True)], run_w4,
    [Ratio("W4 first step adaptive / neuron eager", ("first_step_s", "neuron_adaptive"), ("first_step_s", "neuron_eager"), "<=", 1.2),
     Ratio("W4 N-step total adaptive / torch.compile", ("total_s", "neuron_adaptive"), ("total_s", "compile"), "<", 1.0),
     Ratio("W4 neuron compiled / torch.compile steps/s", ("steps_per_s", "neuron_compile"), ("steps_per_s", "compile"), ">=", 0.95)])

W6 = Workload(
    "W6", "Transformers Llama (2 layers, d=128, T=64, batch 8, from config) AdamW train step",
    [Metric("steps_per_s", "steps/s", "higher")], run_w6,
    [Ratio("W6 adaptive / CPU eager steps/s", ("steps_per_s", "neuron_adaptive"), ("steps_per_s", "native"), ">=", 1.0),
     Ratio("W6 adaptive / neuron eager steps/s", ("steps_per_s", "neuron_adaptive"), ("steps_per_s", "neuron_eager"), ">=", 1.0),
     Ratio("W6 adaptive / torch.compile steps/s", ("steps_per_s", "neuron_adaptive"), ("steps_per_s", "compile"), ">=", 1.0),
     Ratio("W6 neuron compiled / torch.compile steps/s", ("steps_per_s", "neuron_compile"), ("steps_per_s", "compile"), ">=", 0.95)],
    peers=("native", "neuron_eager", "neuron_adaptive", "compile", "neuron_compile"))
