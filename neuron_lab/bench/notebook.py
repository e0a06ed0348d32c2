"""W5: a notebook cell run twice, as a researcher re-runs a cell after reading its output.

The "cell" normalises a batch, takes three MLP train steps with AdamW and evaluates accuracy,
ending in two ``.item()`` calls (the values the cell prints). It runs twice on a fresh model
with the peer's ``sync()`` after each run (``neuron_lab.sync()``: what the cell-end hook does).

Reported: for the adaptive peer, the region cache hit rate of the second run, from the deltas of
``neuron_lab.runtime.stats()``'s ``hits`` and ``misses`` (``hits / (hits + misses)``; the engine
starts empty, so the first run is all misses by construction); for every peer, the wall time of
the first and second run (one sample each: the first run is, by definition, only once).
"""
from __future__ import annotations

import torch

from . import models
from .harness import Metric, Ratio, Skip, Workload, perf


def cell(model, opt, data):
    x, y = data
    x = (x - x.mean(0)) / (x.std(0) + 1e-5)
    for _ in range(3):
        loss = models.train_step(model, opt, x, y)
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean()
    return loss.item(), acc.item()


def _counts():
    from neuron_lab import runtime
    s = runtime.stats()
    return s["hits"], s["misses"]


def run_w5(peer, cfg) -> dict:
    adaptive = peer.name == "neuron_adaptive"
    model, opt, data = models.make("mlp", peer, seed=1)
    times = []
    for run in range(2):
        if adaptive and run == 1:
            h0, m0 = _counts()
        t0 = perf()
        cell(model, opt, data)
        peer.sync()
        times.append((perf() - t0) * 1e3)
    out = {"first_run_ms": times[0], "second_run_ms": times[1],
           "hit_rate": Skip("not applicable: no region cache")}
    if adaptive:
        h1, m1 = _counts()
        dh, dm = h1 - h0, m1 - m0
        out["hit_rate"] = 100.0 * dh / (dh + dm) if dh + dm else Skip("no region lookups")
        out["extra"] = {"second_run": {"hits": dh, "misses": dm}, **peer.extra()}
    return out


W5 = Workload(
    "W5", "notebook cell re-run (normalise + 3 MLP steps + accuracy), second run",
    [Metric("hit_rate", "% hits", "higher"),
     Metric("first_run_ms", "ms", "lower", log=True), Metric("second_run_ms", "ms", "lower", log=True)],
    run_w5,
    [Ratio("W5 second-run region hit rate (%)", ("hit_rate", "neuron_adaptive"), None, ">=", 95.0)])
