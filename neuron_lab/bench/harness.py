"""Timing helpers and the driver that runs one workload on every peer.

Methodology (the same for every workload and peer):

- **Warm-up is excluded.** Each peer first runs the iteration for ``cfg.warm_s`` seconds (at
  least a few iterations); that covers the process's one-time dispatch warm-up, torch.compile's
  and torch._lazy's tracing and compiles. The adaptive peer then *settles* (see ``peers.py``):
  wait for its background compiles, warm up again so the policy finishes its fused-vs-per-op
  trials, and repeat while new compiles were queued.
- **Samples.** The per-iteration time estimated during warm-up sizes each sample to about
  ``cfg.sample_s`` seconds (``inner`` iterations); ``cfg.repeats`` samples are taken (fewer, but
  at least 3, when that would exceed ``cfg.sampling_budget_s``) and the median is reported.
  Steady-state samples are **interleaved across peers** (every peer is set up and warmed first,
  then sample 1 of each peer, sample 2 of each, ...), so a burst of load from other processes
  on a shared machine hits all peers alike and the ratios stay honest. Every sample is kept in
  the JSON.
- **The garbage collector stays on** inside samples: a peer that makes more Python objects pays
  for its collections, as a training loop does. Collections and their seconds are counted per
  sample for every peer alike (``extra["conditions"]``).
- **One core budget for all** (``budget.py``): the process, its threads and its helper
  processes share the CPUs of the run's budget; each sample records the affinity masks it ran
  under (``extra["conditions"]``).
- **CPU time beside wall time.** Each steady sample also measures the CPU seconds of the
  process and its descendants (``budget.cpu_start``/``cpu_stop``), reported per iteration next
  to the wall-time metric (``Steady.cpu``).
- **Every iteration ends at a sync** chosen by the workload (``.item()``, ``peer.sync()``), so
  asynchronous peers are timed for finished work, not for queued work.
- A peer that cannot run a workload raises ``Skip(reason)``; an exception is recorded as a skip
  with ``error: ...`` and its traceback, so one broken peer never hides the others' numbers.
"""
from __future__ import annotations

import gc
import math
import statistics
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from . import budget as _budget

perf = time.perf_counter


class Skip(Exception):
    """This peer does not produce this workload's numbers; the message says why."""


@dataclass
class Config:
    quick: bool = False
    warm_s: float = 1.0
    sample_s: float = 0.25
    repeats: int = 9
    compile_timeout_s: float = 300.0   # per wait for the adaptive runtime's background compiles
    quiesce_timeout_s: float = 300.0   # wait for them before another peer runs (correctness)
    settle_rounds: int = 4             # wait + warm rounds while new compiles keep being queued
    sampling_budget_s: float = 20.0    # a very slow peer takes fewer samples (never under 3)
    fresh_budget_s: float = 120.0      # W4's N-step run stops here and extrapolates (recorded)
    fresh_steps: int = 200
    first_step_repeats: int = 5

    @classmethod
    def make(cls, quick: bool) -> "Config":
        if quick:
            return cls(quick=True, warm_s=0.25, sample_s=0.05, repeats=7, compile_timeout_s=15.0,
                       settle_rounds=3, sampling_budget_s=3.0, fresh_budget_s=15.0, fresh_steps=10,
                       first_step_repeats=2)
        return cls()


@dataclass
class Metric:
    name: str
    unit: str
    better: str = "lower"        # "lower" | "higher"
    log: bool = False            # plot on a log axis


@dataclass
class Ratio:
    """``value = median(num) / median(den)`` (``den=None``: the value itself), against a target."""
    label: str
    num: tuple[str, str]         # (metric, peer)
    den: tuple[str, str] | None
    op: str                      # "<=", ">=", "<"
    target: float

    def evaluate(self, metrics: dict) -> dict:
        def med(ref):
            entry = metrics.get(ref[0], {}).get("peers", {}).get(ref[1], {})
            return entry.get("median")
        a = med(self.num)
        b = 1.0 if self.den is None else med(self.den)
        out = {"label": self.label, "num": list(self.num), "den": list(self.den) if self.den else None,
               "op": self.op, "target": self.target, "value": None, "met": None}
        if a is not None and b:
            v = a / b
            out["value"] = v
            out["met"] = {"<=": v <= self.target, ">=": v >= self.target, "<": v < self.target}[self.op]
        return out


@dataclass
class Workload:
    key: str
    title: str
    metrics: list[Metric]
    run: Callable[[Any, Config], dict]   # (peer, cfg) -> {metric: samples | value, "extra": {...}}
    ratios: list[Ratio] = field(default_factory=list)
    peers: tuple[str, ...] | None = None  # None: every peer


def warm(fn: Callable[[], Any], seconds: float, min_iters: int = 3) -> float:
    """Run ``fn`` for ``seconds`` (at least ``min_iters`` times); returns seconds/iteration of the
    later half (the first iterations include tracing and compiles)."""
    times = []
    t_end = perf() + seconds
    while len(times) < min_iters or perf() < t_end:
        t0 = perf()
        fn()
        times.append(perf() - t0)
        if len(times) >= 10_000:
            break
    tail = times[len(times) // 2:]
    return statistics.median(tail)


@dataclass
class Timed:
    """One sample: seconds and CPU seconds per iteration, the collector's work during it."""
    wall: float
    cpu: float
    gc_collections: int
    gc_s: float
    gc_enabled: bool


def _timed(fn: Callable[[], Any], inner: int, end=None) -> Timed:
    """``inner`` iterations of ``fn`` (then ``end``) timed; the collector is left as it is (on)."""
    watch = _budget.gc_watch()
    g0 = watch.snapshot()
    c0 = _budget.cpu_start()
    t0 = perf()
    for _ in range(inner):
        fn()
    if end is not None:
        end()
    wall = perf() - t0
    c1 = _budget.cpu_stop()
    g1 = watch.snapshot()
    return Timed(wall / inner, (c1 - c0) / inner, sum(g1[:3]) - sum(g0[:3]), g1[3] - g0[3],
                 gc.isenabled())


def _one(fn: Callable[[], Any], inner: int, end=None) -> float:
    return _timed(fn, inner, end).wall


def _plan(per_iter: float, cfg: Config) -> tuple[int, int]:
    """(iterations per sample, samples) for an iteration of ``per_iter`` seconds."""
    inner = max(1, min(100_000, math.ceil(cfg.sample_s / max(per_iter, 1e-9))))
    repeats = max(min(3, cfg.repeats), min(cfg.repeats, int(cfg.sampling_budget_s / (inner * per_iter))))
    return inner, repeats


def sample(fn: Callable[[], Any], per_iter: float, cfg: Config, end=None) -> list[float]:
    """Samples of seconds/iteration, each about ``cfg.sample_s`` long, taken now; ``end`` (e.g.
    the peer's sync) runs inside the timed window after the last iteration."""
    inner, repeats = _plan(per_iter, cfg)
    return [_one(fn, inner, end) for _ in range(repeats)]


@dataclass
class Steady:
    """A warmed-up iteration waiting to be sampled; the driver samples every peer's round-robin.
    ``convert`` maps each metric it feeds to a function of seconds/iteration."""
    fn: Callable[[], Any]
    per_iter: float
    end: Callable[[], Any] | None
    convert: dict[str, Callable[[float], float]]
    cpu: dict[str, Callable[[float], float]] = field(default_factory=dict)   # f(CPU s/iter)


@dataclass
class Fresh:
    """One-off samples a workload cannot take in a loop (a fresh model's first step): ``take()``
    returns one, in seconds, inside the peer's ``fresh_sampling()``. The driver takes sample r
    of every peer, then sample r + 1, ..., after all set-ups, as it does the steady samples, so
    a slow spell of the machine does not land on one peer's samples only."""
    take: Callable[[], float]
    repeats: int


def steady(fn: Callable[[], Any], peer, cfg: Config, min_iters: int = 3, end=None,
           cpu: dict[str, Callable[[float], float]] | None = None,
           **convert: Callable[[float], float]) -> Steady:
    """Warm ``fn`` up on ``peer`` (and settle the adaptive runtime); the samples are taken
    later, interleaved with the other peers'. ``convert``: metric name -> f(seconds/iter);
    ``cpu``: metric name -> f(CPU seconds/iter)."""
    per = warm(fn, cfg.warm_s, min_iters)
    per = peer.settle(lambda: warm(fn, cfg.warm_s, max(min_iters, 5)), cfg) or per
    if end is not None:
        end()
    return Steady(fn, per, end, convert, dict(cpu or {}))


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def _entry(value) -> dict:
    samples = [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)]
    return {"median": statistics.median(samples), "samples": samples}


def _error(e: BaseException) -> str:
    return str(e) if isinstance(e, Skip) else f"error: {type(e).__name__}: {e}"[:400]


def _round_robin(jobs: dict, peers: dict, cfg: Config, reasons: dict, extra: dict) -> dict:
    """Round-robin sampling: sample r of every job, then sample r + 1, ... so load from other
    processes on a shared machine hits all peers alike. ``jobs``: key -> (peer name, repeats,
    context, take): ``take()`` returns one sample, inside ``context()``. Before each sample,
    background compiles (the adaptive runtime's) are waited for, untimed: they would steal the
    sampled peer's core, and inductor's FX tracing patches ``nn.Module.__call__`` process-wide,
    which breaks a torch.compile'd module called meanwhile (see docs/benchmarks.md). A peer that
    raises gets its reason and takes no more samples. Returns key -> samples."""
    samples: dict = {k: [] for k in jobs}
    for r in range(max((job[1] for job in jobs.values()), default=0)):
        for k, (n, repeats, context, take) in jobs.items():
            if r >= repeats or n in reasons:
                continue
            for p in peers.values():    # untimed: no background compile runs during a sample
                p.quiesce(cfg)
            try:
                with context():
                    _note(extra, n, _budget.conditions())
                    samples[k].append(take())
            except Exception as e:  # noqa: BLE001
                reasons[n] = _error(e)
                extra.setdefault("errors", {})[n] = traceback.format_exc()[-4000:]
    return samples


def _note(extra: dict, peer: str, cond: dict) -> None:
    """Record the conditions a sample of ``peer`` ran under (distinct ones only)."""
    seen = extra.setdefault("conditions", {}).setdefault(peer, {"seen": []})
    if cond not in seen["seen"]:
        seen["seen"].append(cond)


def _interleave(pending: dict, peers: dict, cfg: Config, outs: dict, reasons: dict, extra: dict):
    """The steady samples of every peer (``Steady``; a peer may have several, keyed
    ``(peer, variant)``), round-robin; each metric gets its list."""
    jobs = {}
    for (n, v), st in pending.items():
        inner, repeats = _plan(st.per_iter, cfg)
        jobs[(n, v)] = (n, repeats, peers[n].sampling,
                        lambda st=st, inner=inner: _timed(st.fn, inner, st.end))
    gc.collect()                # once, before any peer's samples: the same start for all
    times = _round_robin(jobs, peers, cfg, reasons, extra)
    for (n, v), st in pending.items():
        got = times[(n, v)]
        for metric, f in st.convert.items():
            outs[n][metric] = [f(t.wall) for t in got]
        for metric, f in st.cpu.items():
            outs[n][metric] = [f(t.cpu) for t in got]
        if got:
            inner = _plan(st.per_iter, cfg)[0]
            sampled = sum(t.wall for t in got) * inner      # seconds inside this variant's samples
            c = extra.setdefault("conditions", {}).setdefault(n, {"seen": []})
            c.setdefault("gc", {})[v] = {
                "collections_per_sample": [t.gc_collections for t in got],
                "seconds_share": sum(t.gc_s for t in got) / sampled if sampled else None,
                "enabled": all(t.gc_enabled for t in got)}


def _take_fresh(outs: dict, peers: dict, cfg: Config, reasons: dict, extra: dict) -> None:
    """The peers' ``Fresh`` metrics, round-robin: each becomes its list of samples."""
    jobs = {(n, m): (n, v.repeats, peers[n].fresh_sampling, v.take)
            for n, o in outs.items() for m, v in o.items() if isinstance(v, Fresh)}
    for (n, m), taken in _round_robin(jobs, peers, cfg, reasons, extra).items():
        outs[n][m] = taken


def run_workload(w: Workload, peers: list, cfg: Config, log=print) -> dict:
    """Run ``w`` on each peer in turn (set-up, warm-up, one-off measurements), then take the
    steady-state samples of all peers interleaved; returns the workload's JSON record."""
    t0 = perf()
    metrics = {m.name: {"unit": m.unit, "better": m.better, "log": m.log, "peers": {}}
               for m in w.metrics}
    extra: dict[str, Any] = {}
    outs: dict[str, dict] = {}
    reasons: dict[str, str] = {}
    for peer in peers:
        t_peer = perf()
        out: dict = {}
        if w.peers is not None and peer.name not in w.peers:
            reasons[peer.name] = f"not applicable: {w.key} measures {', '.join(w.peers)} only"
        elif peer.workloads is not None and w.key not in peer.workloads:
            reasons[peer.name] = f"not applicable: {peer.label} runs {', '.join(peer.workloads)} only"
        elif peer.unavailable:
            reasons[peer.name] = peer.unavailable
        else:
            try:
                with peer.active():
                    out = w.run(peer, cfg) or {}
            except Exception as e:  # noqa: BLE001 - record, keep measuring the other peers
                reasons[peer.name] = _error(e)
                if not isinstance(e, Skip):
                    extra.setdefault("errors", {})[peer.name] = traceback.format_exc()[-4000:]
            finally:
                peer.cleanup(cfg)
        outs[peer.name] = out
        log(f"  {w.key} {peer.name}: set up in {perf() - t_peer:.1f} s"
            + (f" (skip: {reasons[peer.name]})" if peer.name in reasons else ""))
    _take_fresh(outs, {p.name: p for p in peers}, cfg, reasons, extra)
    pending = {(n, k): o.pop(k) for n, o in outs.items()
               for k in [k for k, v in o.items() if isinstance(v, Steady)]}
    _interleave(pending, {p.name: p for p in peers}, cfg, outs, reasons, extra)
    stepped = {n for n, _ in pending}
    for peer in peers:
        if peer.name in stepped:
            peer.cleanup(cfg)       # compiles queued while sampling must not leak into the next workload
    for peer in peers:
        out = outs[peer.name]
        x = out.pop("extra", None)
        if callable(x):
            x = x()
        if x:
            extra[peer.name] = x
        for m in w.metrics:
            v, reason = out.get(m.name), reasons.get(peer.name)
            if reason is not None:
                metrics[m.name]["peers"][peer.name] = {"skip": reason}
            elif isinstance(v, Skip):
                metrics[m.name]["peers"][peer.name] = {"skip": str(v)}
            elif v is None or v == []:
                metrics[m.name]["peers"][peer.name] = {"skip": "not measured for this peer"}
            else:
                metrics[m.name]["peers"][peer.name] = _entry(v)
    log(f"  {w.key}: done in {perf() - t0:.1f} s")
    return {"title": w.title, "metrics": metrics,
            "ratios": [r.evaluate(metrics) for r in w.ratios],
            "extra": extra, "seconds": perf() - t0}
