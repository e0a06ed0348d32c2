"""The six peers measured side by side, each behind the same small interface.

=================  ==================================================================================
``native``         CPU eager PyTorch, no device layer.
``neuron_eager``   the ``neuron`` device, one launch per op (``neuron_lab.mode("eager")``).
``neuron_adaptive`` the ``neuron`` device in adaptive mode (the default): queued, cached, fused.
``compile``        ``torch.compile`` with default settings (inductor, CPU C++ kernels) on CPU
                   tensors; modules are compiled with ``torch.compile(model)``, the optimizer runs
                   eager (the way most users write it).
``neuron_compile`` ``torch.compile(model, backend="neuron")`` on the ``neuron`` device (the same
                   inductor code as ``compile``, bound to neuron tensors; docs/compile.md); the
                   optimizer runs eager in adaptive mode, as ``compile``'s runs eager. W3, W4, W6.
``lazy``           ``torch._lazy`` (C++ lazy tensor core, TorchScript reference backend: no CPU
                   fusion, eager fallbacks for ops it lacks), device ``"lazy"``,
                   ``torch._lazy.mark_step()`` at the end of every iteration.
=================  ==================================================================================

Every peer runs in the benchmark's one process, on the run's core budget (``budget.py``): its
threads and any process it starts (the adaptive runtime's compile helper, inductor's compile
workers, the C++ compiler) inherit the affinity mask.

Interface: ``device``; ``active()`` (context for a workload's set-up: the adaptive and neuron
compiled peers start from an empty region cache); ``sampling()`` (context for one timed sample:
those two with the runtime that learned their regions installed, ``runtime.installed``); ``compile(fn)`` /
``module(m)`` (what torch.compile wraps; identity elsewhere); ``step_end()`` (the per-iteration
boundary: ``mark_step`` for lazy); ``sync()`` (finish all queued work); ``settle(warm, cfg)``
(adaptive only: wait for background compiles, warm again, until no compile was queued and no
region is in its fused-vs-per-op trial);
``cleanup(cfg)`` / ``quiesce(cfg)`` (between peers and between samples: let background compiles
finish so they do not steal the next peer's core); ``fresh_sampling()`` (context for one
sample of a fresh model: the adaptive peers start it from an empty region cache) with
``fresh_repeatable`` (False where in-process compile caches make a second fresh model cheaper:
torch.compile, torch._lazy); ``unavailable`` (skip reason
when the peer cannot run here).
"""
from __future__ import annotations

import contextlib
import time

import torch

ORDER = ("native", "neuron_eager", "neuron_adaptive", "compile", "neuron_compile", "lazy")
LABELS = {"native": "CPU eager", "neuron_eager": "neuron eager", "neuron_adaptive": "neuron adaptive",
          "compile": "torch.compile", "neuron_compile": "neuron compiled", "lazy": "torch._lazy"}


class Peer:
    name = "native"
    device = "cpu"
    unavailable: str | None = None
    workloads: tuple[str, ...] | None = None   # None: every workload
    fresh_repeatable = True     # a second fresh model's first step costs what the first's did

    @property
    def label(self) -> str:
        return LABELS[self.name]

    def active(self):
        return contextlib.nullcontext()

    def sampling(self):
        return contextlib.nullcontext()

    def compile(self, fn):
        return fn

    def module(self, m):
        return m

    def step_end(self) -> None:
        pass

    def sync(self) -> None:
        pass

    def settle(self, warm, cfg):
        return None

    def cleanup(self, cfg) -> None:
        pass

    def quiesce(self, cfg) -> None:
        pass

    def fresh_sampling(self):
        """Context for one sample of a fresh model (``harness.Fresh``): as ``sampling``; the
        adaptive peers start it from an empty region cache."""
        return self.sampling()

    def extra(self) -> dict:
        return {}


def _trials(rt) -> int:
    """Regions of runtime ``rt`` whose fused-vs-per-op trial (runtime.policy) is still running:
    their launches alternate kinds, so a sample taken now is not the steady state."""
    return sum(r.status == "trial" for r in rt.regions())


class NeuronEager(Peer):
    name, device = "neuron_eager", "neuron"
    mode = "eager"

    def active(self):
        import neuron_lab
        return neuron_lab.mode(self.mode)

    def sampling(self):
        import neuron_lab
        return neuron_lab.mode(self.mode)

    def sync(self) -> None:
        import neuron_lab
        neuron_lab.sync()


class NeuronAdaptive(NeuronEager):
    """The adaptive runtime. Each such peer (this one and ``neuron_compile``) has a runtime of
    its own (``runtime.Runtime``): it learns its regions from an empty cache at its set-up,
    and is sampled and reported with that runtime installed (``runtime.installed``), so the
    peers of a workload, set up one after the other and then sampled in turn, never run with
    each other's regions."""
    name, mode = "neuron_adaptive", "adaptive"
    _rt = None          # this peer's runtime
    _scratch = None     # the runtime of its fresh samples: emptied before each

    def _runtime(self):
        from neuron_lab import runtime
        if self._rt is None:
            self._rt = runtime.Runtime()
        return self._rt

    @contextlib.contextmanager
    def active(self):
        import neuron_lab
        from neuron_lab import runtime
        runtime.wait_compiles(None)
        rt = self._runtime()
        rt.reset()                  # each set-up starts from an empty region cache
        self._compile_s0 = rt.stats()["compile_seconds"]   # the worker's total is per process
        self.settle_info = None
        self._device_thread = [0.0, 0.0]   # seconds busy, seconds sampled (``sampling``)
        with runtime.installed(rt), neuron_lab.mode("adaptive"):
            yield

    @contextlib.contextmanager
    def sampling(self):
        """A steady sample of this peer; also adds up how long the device's thread ran
        launches meanwhile (``extra``'s ``device_thread_busy_share``: near 1, the step is the
        device's programs; the host's work is hidden behind them)."""
        import neuron_lab
        from neuron_lab import runtime
        rt = self._runtime()
        with runtime.installed(rt), neuron_lab.mode(self.mode):
            busy, t0 = rt.launches().device_thread_busy_s, time.perf_counter()
            try:
                yield
            finally:
                self._device_thread[0] += rt.launches().device_thread_busy_s - busy
                self._device_thread[1] += time.perf_counter() - t0

    def settle(self, warm, cfg):
        from neuron_lab import runtime
        rt = self._runtime()
        per, t0 = None, time.perf_counter()
        info = self.settle_info = {"rounds": 0, "drained": True}
        for _ in range(cfg.settle_rounds):
            queued = rt.stats()["compiles_queued"]
            info["drained"] = runtime.wait_compiles(cfg.compile_timeout_s) and info["drained"]
            per = warm()
            info["rounds"] += 1
            if rt.stats()["compiles_queued"] == queued and not _trials(rt):
                break
        info["seconds"] = time.perf_counter() - t0
        info["pending_at_measure"] = rt.stats()["compiles_pending"]
        info["trials_at_measure"] = _trials(rt)
        info["queued_at_measure"] = rt.stats()["compiles_queued"]
        return per

    def cleanup(self, cfg) -> None:
        self.quiesce(cfg)

    def quiesce(self, cfg) -> None:
        from neuron_lab import runtime
        if runtime.stats()["compiles_pending"]:
            runtime.wait_compiles(cfg.quiesce_timeout_s)

    @contextlib.contextmanager
    def fresh_sampling(self):
        import neuron_lab
        from neuron_lab import runtime
        runtime.wait_compiles(None)
        if self._scratch is None:
            self._scratch = runtime.Runtime()
        self._scratch.reset()                       # an empty region cache
        try:
            with runtime.installed(self._scratch), neuron_lab.mode(self.mode):
                yield
        finally:
            runtime.wait_compiles(None)

    def extra(self) -> dict:
        """Runtime counters since this peer's set-up started from an empty region cache."""
        return self._counters()

    def _counters(self) -> dict:
        rt = self._runtime()
        s = rt.stats()
        keep = ("hits", "misses", "hit_rate", "launches_fused", "launches_per_op", "ops_fused",
                "ops_per_op", "fused_share", "compiles_queued", "compiles_done", "compiles_failed",
                "compiles_slower", "compiles_pending", "compile_seconds", "regions", "flushes")
        out = {k: s.get(k) for k in keep}
        out["compile_seconds"] = s["compile_seconds"] - getattr(self, "_compile_s0", 0.0)
        out["settle"] = getattr(self, "settle_info", None)
        busy, sampled = getattr(self, "_device_thread", (0.0, 0.0))
        out["device_thread_busy_share"] = busy / sampled if sampled else None
        regs = [r.summary() for r in rt.regions()]
        out["region_status"] = {}
        for r in regs:
            out["region_status"][r["status"]] = out["region_status"].get(r["status"], 0) + 1
        out["hot_regions"] = sorted(regs, key=lambda r: -r["hits"])[:5]
        return out


class Compile(Peer):
    name = "compile"
    fresh_repeatable = False

    def compile(self, fn):
        return torch.compile(fn)

    def module(self, m):
        return torch.compile(m)


class NeuronCompile(NeuronAdaptive):
    name = "neuron_compile"
    fresh_repeatable = False
    workloads = ("W3", "W4", "W6")

    def compile(self, fn):
        return torch.compile(fn, backend="neuron")

    def module(self, m):
        return torch.compile(m, backend="neuron")

    def extra(self) -> dict:
        from neuron_lab.compile import outcomes
        tc = outcomes.snapshot()
        out = super().extra()
        out["torch_compile"] = {k: tc[k] for k in ("frames", "recompiles", "programs", "graph_breaks",
                                                   "failures", "dynamo_compile_seconds")}
        return out


class Lazy(Peer):
    name, device = "lazy", "lazy"
    fresh_repeatable = False
    _ready: bool | None = None

    def __init__(self) -> None:
        if Lazy._ready is None:
            try:
                import torch._lazy
                import torch._lazy.ts_backend
                torch._lazy.ts_backend.init()
                Lazy._ready = True
            except Exception as e:  # noqa: BLE001
                Lazy._ready = False
                Lazy.unavailable = f"torch._lazy unavailable: {type(e).__name__}: {e}"[:300]

    def step_end(self) -> None:
        torch._lazy.mark_step()

    def sync(self) -> None:
        torch._lazy.mark_step()
        torch._lazy.wait_device_ops()


_CLASSES = {c.name: c for c in (Peer, NeuronEager, NeuronAdaptive, Compile, NeuronCompile, Lazy)}


def make(names=ORDER) -> list[Peer]:
    unknown = [n for n in names if n not in _CLASSES]
    if unknown:
        raise ValueError(f"unknown peer(s) {unknown}; choose from {', '.join(ORDER)}")
    return [_CLASSES[n]() for n in ORDER if n in names]
