"""Micro workloads: per-op overhead (W1), a bandwidth-bound chain (W2), telemetry overhead (W1T).

W1 — 63 elementwise ops (mul, add, tanh in turn) on 1 K floats plus a ``sum``: 64 tiny ops, then
``.item()`` every iteration. Reported as iteration time / 64 (µs/op), the sync included: it is
the per-op cost a notebook user pays for small code that looks at its values; beside it the
CPU seconds of the process and its helpers / 64 (CPU µs/op).

W2 — a 20-op chain of cheap elementwise ops (mul, add, clamp_min, sub, abs) on 4 M floats
(16 MiB), the peer's ``sync()`` every iteration. Reported in ms and as a percentage of the
machine's copy bandwidth, measured in the same run (``dst.copy_(src)`` on a 256 MiB tensor,
counting read + write bytes). The chain's useful traffic is one read and one write of 16 MiB
(what a perfectly fused program moves), so 100 % means "as fast as a memcpy of the data";
an op-by-op peer moves 20× that and lands near 5 %.
Peak device memory on W2 (neuron peers): ``reset_peak_memory_stats()``, one iteration,
``max_memory_allocated()`` minus what was allocated before (the input), median of 3.

W1T — W1 on the adaptive peer with ``neuron_lab.telemetry`` fully on vs off (what "on" means:
``telemetry_switch``), samples interleaved (off, on, off, on, ...) so machine noise hits both
alike. The other workloads run with telemetry as the process had it (not imported: off).
"""
from __future__ import annotations

import statistics
import sys

import torch

from .harness import Metric, Ratio, Skip, Workload, perf, sample, steady, warm

W1_OPS, W1_N = 64, 1024
W2_OPS, W2_N = 20, 4 << 20
_copy_bw: dict = {}


def tiny_chain(x):
    for i in range(W1_OPS - 1):
        k = i % 3
        x = x * 1.01 if k == 0 else x + 0.01 if k == 1 else torch.tanh(x)
    return x.sum()


def elementwise_chain(x):
    for i in range(W2_OPS):
        k = i % 5
        x = (x * 1.001 if k == 0 else x + 0.01 if k == 1 else x.clamp_min(-2.0) if k == 2
             else x - 0.005 if k == 3 else x.abs())
    return x


def _w1_iteration(peer):
    x = torch.randn(W1_N, generator=torch.Generator().manual_seed(0)).to(peer.device)
    f = peer.compile(tiny_chain)

    def it():
        s = f(x)
        peer.step_end()
        s.item()
    return it


def run_w1(peer, cfg) -> dict:
    st = steady(_w1_iteration(peer), peer, cfg, us_per_op=lambda t: t / W1_OPS * 1e6,
                cpu={"cpu_us_per_op": lambda c: c / W1_OPS * 1e6})
    return {"steady": st, "extra": peer.extra}


def copy_bandwidth(cfg) -> dict:
    """Host copy bandwidth (GB/s, read + write bytes), measured once per run."""
    if not _copy_bw:
        n = (16 << 20) if cfg.quick else (64 << 20)
        src, dst = torch.rand(n), torch.empty(n)
        for _ in range(2):
            dst.copy_(src)
        times = []
        for _ in range(max(cfg.repeats, 5)):
            t0 = perf()
            dst.copy_(src)
            times.append(perf() - t0)
        nbytes = 2 * n * 4
        _copy_bw.update(GBps=nbytes / statistics.median(times) / 1e9,
                        samples=[nbytes / t / 1e9 for t in times], bytes=nbytes)
    return _copy_bw


def run_w2(peer, cfg) -> dict:
    bw = copy_bandwidth(cfg)["GBps"] * 1e9
    x = torch.randn(W2_N, generator=torch.Generator().manual_seed(0)).to(peer.device)
    f = peer.compile(elementwise_chain)

    def it():
        y = f(x)
        peer.sync()
        return y
    useful = 2 * W2_N * 4
    out = {"steady": steady(it, peer, cfg, ms=lambda t: t * 1e3,
                            pct_copy_bw=lambda t: useful / t / bw * 100,
                            cpu={"cpu_ms": lambda c: c * 1e3}),
           "peak_mib": Skip("peak device memory: neuron peers only")}
    if peer.device == "neuron":
        peaks = []
        for _ in range(3):
            peer.sync()
            torch.neuron.reset_peak_memory_stats()
            base = torch.neuron.memory_allocated()
            y = f(x)
            peer.sync()
            del y
            peaks.append((torch.neuron.max_memory_allocated() - base) / 2**20)
        out["peak_mib"] = peaks
    out["extra"] = lambda: {**peer.extra(), "copy_bandwidth_GBps": copy_bandwidth(cfg)}
    return out


def telemetry_switch():
    """(what "on" means, turn everything on, turn it off) for ``neuron_lab.telemetry``, or Skip.

    An explicit switch (``enable_all``/``disable_all``, ``enable``/``disable``) wins. Otherwise
    "everything on" is assembled from the parts a notebook session runs: the store subscribed
    to the event bus (launch/compile/sync/fallback records), the memory sampler at its maximum
    rate (20 Hz) with a listener, and a per-cell record in progress. "Off": none of them.
    """
    try:
        import neuron_lab.telemetry as tel
    except Exception as e:  # noqa: BLE001
        raise Skip(f"neuron_lab.telemetry not importable: {type(e).__name__}: {e}") from None
    for on, off, args in (("enable_all", "disable_all", ()), ("enable", "disable", ())):
        if callable(getattr(tel, on, None)) and callable(getattr(tel, off, None)):
            return f"telemetry.{on}()", (lambda: getattr(tel, on)(*args)), (lambda: getattr(tel, off)())
    if not all(hasattr(tel, n) for n in ("store", "Sampler", "cells")):
        raise Skip("neuron_lab.telemetry has no 'everything on' switch (enable_all()/enable()) "
                   "nor store/Sampler/cells to assemble one from")
    sampler = tel.Sampler()
    sampler.set_rate(20.0)
    sampler.listeners.append(lambda sample: None)

    def on():
        tel.store.start()
        sampler.start()
        tel.cells.start("bench-W1T")

    def off():
        if tel.cells.running:
            tel.cells.end()
        sampler.stop()
        tel.store.stop()
    return "store on the event bus + 20 Hz memory sampler + a running cell record", on, off


def run_w1t(peer, cfg) -> dict:
    from neuron_lab.device import events
    listening = events.active()     # importing telemetry subscribes its store: undo that after
    what, on, off = telemetry_switch()
    off()
    it = _w1_iteration(peer)
    per = steady(it, peer, cfg).per_iter
    offs, ons = [], []
    one = type(cfg)(**{**cfg.__dict__, "repeats": 1})
    try:
        for _ in range(cfg.repeats):
            offs += sample(it, per, one)
            on()
            warm(it, cfg.warm_s / 5, 3)
            ons += sample(it, per, one)
            off()
    finally:
        off()
        store = getattr(sys.modules.get("neuron_lab.telemetry"), "store", None)
        if listening and store is not None:
            store.start()
    return {"us_per_op_off": [t / W1_OPS * 1e6 for t in offs],
            "us_per_op_on": [t / W1_OPS * 1e6 for t in ons], "extra": {"telemetry_on": what}}


W1 = Workload(
    "W1", "64 tiny ops (1 K floats), .item() each iteration",
    [Metric("us_per_op", "µs/op", "lower", log=True),
     Metric("cpu_us_per_op", "CPU µs/op", "lower", log=True)], run_w1,
    [Ratio("W1 adaptive / torch._lazy µs/op", ("us_per_op", "neuron_adaptive"), ("us_per_op", "lazy"), "<=", 1.2),
     Ratio("W1 adaptive / torch._lazy µs/op (beyond: beat C++ lazy)", ("us_per_op", "neuron_adaptive"), ("us_per_op", "lazy"), "<=", 0.8),
     Ratio("W1 adaptive / CPU eager µs/op", ("us_per_op", "neuron_adaptive"), ("us_per_op", "native"), "<=", 1.5),
     Ratio("W1 neuron eager / CPU eager µs/op", ("us_per_op", "neuron_eager"), ("us_per_op", "native"), "<=", 2.5)])

W2 = Workload(
    "W2", "20-op elementwise chain on 4 M floats, sync each iteration",
    [Metric("ms", "ms", "lower", log=True),
     Metric("cpu_ms", "CPU ms", "lower", log=True),
     Metric("pct_copy_bw", "% copy BW", "higher"),
     Metric("peak_mib", "MiB peak", "lower")], run_w2,
    [Ratio("W2 speed-up of adaptive over CPU eager", ("ms", "native"), ("ms", "neuron_adaptive"), ">=", 5.0),
     Ratio("W2 adaptive speed / torch.compile speed", ("ms", "compile"), ("ms", "neuron_adaptive"), ">=", 0.9),
     Ratio("W2 peak memory adaptive / eager", ("peak_mib", "neuron_adaptive"), ("peak_mib", "neuron_eager"), "<=", 0.5)])

W1T = Workload(
    "W1T", "telemetry overhead: W1 on neuron adaptive, telemetry fully on vs off",
    [Metric("us_per_op_off", "µs/op", "lower"), Metric("us_per_op_on", "µs/op", "lower")],
    run_w1t,
    [Ratio("W1T telemetry on / off", ("us_per_op_on", "neuron_adaptive"), ("us_per_op_off", "neuron_adaptive"), "<=", 1.05)],
    peers=("neuron_adaptive",))
