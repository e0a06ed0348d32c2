"""Training workloads: an MLP (W3), a tiny GPT (W4) and a Transformers Llama (W6) train step,
all with AdamW.

One step = ``zero_grad``, forward, cross-entropy, ``backward``, ``AdamW.step`` (the same
implementation for every peer, set explicitly: ``models.OPTIMIZER``), then the peer's step
boundary (``mark_step`` for lazy). Two steady variants, sampled interleaved like every metric:

- ``steps_per_s`` — **a sync per step**: ``loss.item()`` after every step, as a loop that logs
  its loss does. An asynchronous peer cannot run ahead of its device.
- ``steps_per_s_sync{N}`` — **a sync every N steps** (``SYNC_EVERY``, 10): one iteration is N
  steps, then ``loss.item()``; the host may queue up to N steps ahead of the device.

Each comes with its CPU cost, ``cpu_ms_per_step`` / ``cpu_ms_per_step_sync{N}``: CPU seconds of
the process and its helper processes per step (``budget.cpu_start``), so a peer that keeps a
second thread busy shows it even where its wall time does not. Each timed sample also ends
with the peer's ``sync()``, inside the window, so queued work is paid for.

W4 also measures what a user sees from a fresh model, *without* waiting for background compiles:
``first_step_s`` — from the first ``train_step`` call until its loss is on the host (``.item()``),
on a fresh model (and, adaptive, an empty region cache: ``peer.fresh_sampling()``) each time:
``cfg.first_step_repeats`` samples (5; 2 with ``--quick``) for the peers whose first step is
repeatable in one process, taken after every peer's set-up and interleaved across peers like
the steady samples (``harness.Fresh``); one for torch.compile and torch._lazy (their in-process
compile caches make a second fresh model cheaper than a first), the first step of the run below;
``total_s`` — from the same start until step N's loss is on the host (N = 200, 10 with
``--quick``), compiles included (torch.compile's happen inside the first step; the adaptive
runtime's in a background thread that competes for the budget's cores); that is a single
measurement, so it carries one sample. A peer still short of N
steps after ``cfg.fresh_budget_s`` (120 s; torch._lazy re-traces every step) stops there and
the rest is extrapolated from its mean step time after the first; the JSON's ``fresh_run``
records ``steps_run`` and ``measured_s`` when that happened. Those two are single
measurement (a fresh model and a fresh region cache), so it carries one sample.
"""
from __future__ import annotations

from . import models
from .harness import Fresh, Metric, Ratio, Skip, Workload, perf, steady


SYNC_EVERY = 10
SYNCN = f"sync{SYNC_EVERY}"


def _loop(peer, model, opt, batch):
    x, y = batch

    def it():
        loss = models.train_step(model, opt, x, y)
        peer.step_end()
        return loss
    return it


def _variants(it, peer, cfg) -> dict:
    """The two steady variants of a train step ``it``: a sync per step, a sync every N steps."""
    def each():
        it().item()

    def block():
        for _ in range(SYNC_EVERY - 1):
            it()
        it().item()
    n = SYNC_EVERY
    return {"steady": steady(each, peer, cfg, end=peer.sync, steps_per_s=lambda t: 1.0 / t,
                             cpu={"cpu_ms_per_step": lambda c: c * 1e3}),
            "steady_" + SYNCN: steady(block, peer, cfg, end=peer.sync,
                                      cpu={f"cpu_ms_per_step_{SYNCN}": lambda c: c * 1e3 / n},
                                      **{f"steps_per_s_{SYNCN}": lambda t: n / t})}


def _steady_metrics() -> list[Metric]:
    return [Metric("steps_per_s", "steps/s, sync every step", "higher"),
            Metric("cpu_ms_per_step", "CPU ms/step, sync every step", "lower"),
            Metric(f"steps_per_s_{SYNCN}", f"steps/s, sync every {SYNC_EVERY} steps", "higher"),
            Metric(f"cpu_ms_per_step_{SYNCN}", f"CPU ms/step, sync every {SYNC_EVERY} steps",
                   "lower")]


def _vs(key: str, num: str, den: str, target: float, op: str = ">=") -> list[Ratio]:
    """The same steps/s ratio for both sync variants."""
    from .peers import LABELS
    return [Ratio(f"{key} {LABELS[num]} / {LABELS[den]} steps/s{tag}", (m, num), (m, den), op, target)
            for m, tag in (("steps_per_s", ", sync every step"),
                           (f"steps_per_s_{SYNCN}", f", sync every {SYNC_EVERY}"))]


def run_w3(peer, cfg) -> dict:
    it = _loop(peer, *models.make("mlp", peer))
    return {**_variants(it, peer, cfg), "extra": peer.extra}


def run_w6(peer, cfg) -> dict:
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise Skip(f"needs Transformers (pip install neuron_lab[bench]): {e}") from None
    it = _loop(peer, *models.make("llama", peer))
    return {**_variants(it, peer, cfg), "extra": peer.extra}


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
    return {**_variants(it, peer, cfg),
            "first_step_s": (Fresh(lambda: _first_step(peer), cfg.first_step_repeats)
                             if peer.fresh_repeatable else [first]),
            "total_s": total,
            "extra": lambda: {"fresh_run": fresh, "steady": peer.extra()}}


W3 = Workload(
    "W3", "MLP 256-512-512-10, batch 128, AdamW train step",
    _steady_metrics(), run_w3,
    [*_vs("W3", "neuron_adaptive", "native", 1.3), *_vs("W3", "neuron_adaptive", "compile", 1.0),
     *_vs("W3", "neuron_compile", "compile", 0.95)])

W4 = Workload(
    "W4", "tiny GPT (2 layers, d=128, T=64, batch 16) AdamW train step",
    [*_steady_metrics(),
     Metric("first_step_s", "s to first step", "lower", log=True),
     Metric("total_s", "s to N steps", "lower", log=True)], run_w4,
    [Ratio("W4 first step adaptive / neuron eager", ("first_step_s", "neuron_adaptive"), ("first_step_s", "neuron_eager"), "<=", 1.2),
     Ratio("W4 N-step total adaptive / torch.compile", ("total_s", "neuron_adaptive"), ("total_s", "compile"), "<", 1.0),
     *_vs("W4", "neuron_compile", "compile", 0.95)])

W6 = Workload(
    "W6", "Transformers Llama (2 layers, d=128, T=64, batch 8, from config) AdamW train step",
    _steady_metrics(), run_w6,
    [*_vs("W6", "neuron_adaptive", "native", 1.0), *_vs("W6", "neuron_adaptive", "compile", 1.0),
     *_vs("W6", "neuron_adaptive", "neuron_eager", 1.0),
     *_vs("W6", "neuron_compile", "compile", 0.95)])
