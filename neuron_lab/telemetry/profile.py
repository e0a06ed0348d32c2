"""``neuron_lab.profile()``: a torch.profiler session plus neuron_lab's own records, exported.

Launches and compiles appear as ``neuron::fused[region N]`` / ``neuron::per-op[...]`` /
``neuron::compile[...]`` ranges (the runtime opens ``record_function`` ranges while a profiler
is active). While the block runs, a private sampler reads device memory at 20 Hz (not into the
shared timeline, which the views draw at their own pace). On exit, under ``out_dir``:

- ``trace.json``: the Chrome trace (Perfetto, chrome://tracing) with the device's track
  (``neuron:0``: one event per launch, from ``ProfilerActivity.PrivateUse1``, device/csrc/
  profiler.cpp), a ``neuron memory`` counter track and a ``neuron fallback`` marker per
  fallback (``export.export_chrome_trace``);
- ``trace.parquet``: one self-contained file, the device launches and everything the advisor
  reads (``trace_file.py``): ``python -m neuron_lab analyze out_dir/trace.parquet``;
- ``launches``, ``cells``, ``memory``, ``fallbacks``, ``syncs``, ``boundaries``, ``regions``,
  ``advice``, ``runtime``: tables as Parquet when ``pyarrow`` is installed, else CSV
  (``export.export_table``; ``export.read_table`` reads back). Their columns are documented in
  docs/telemetry.md ("Export schema").

The block ends with ``runtime.sync("profile-end")`` so its queued work is inside the profile.
Every op of the block is priced on the modelled chip (trn2 unless NEURON_LAB_CHIP says trn3;
``estimate.OpCosts``; ``Profile.modelled``:
launches, modelled_s, bytes, flops, ops, each recognised region as one fused launch), and each
launch row gets ``modelled_s``, ``bytes``, ``flops`` of its region as one fused launch.
"""
from __future__ import annotations

import contextlib
import os
import time

import torch

from ..device import profiler as device_profiler, tracking
from .cost_model import cost_model
from .advise import findings
from .costing import annotate, region_rows
from .device_events import device_launches
from .recording import live_recording
from .trace_file import write_trace
from .estimate import OpCosts, price
from .export import export_chrome_trace, export_table
from .overview import metrics
from .sampler import Sampler
from .store import store

PROFILE_SAMPLE_HZ = 20.0


class Profile:
    """Result of a ``profile()`` block: the torch profiler, paths written, the records."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.prof: torch.profiler.profile | None = None
        self.trace_path = self.launches_path = self.cells_path = None
        self.memory_path = self.fallbacks_path = self.runtime_path = None
        self.syncs_path = self.boundaries_path = self.regions_path = self.advice_path = None
        self.launches: list[dict] = []
        self.memory: list[dict] = []
        self.fallback_events: list[dict] = []
        self.wall_s = 0.0
        self.chip = cost_model().chip
        self.trace_file_path = None  # trace.parquet: device launches + what advise() reads
        self.device_launches: list = []   # device_events.DeviceLaunch, as torch.profiler got them
        self.modelled: dict = {}     # estimate.price of every op in the block, on ``chip``

    @property
    def peak_bytes(self) -> int:
        return max((s["peak"] for s in self.memory), default=0)

    def key_averages(self):
        return self.prof.key_averages()


def _write(result: Profile, trace: bool, tables: bool) -> None:
    out = result.out_dir
    if trace:
        result.trace_path = export_chrome_trace(result.prof, os.path.join(out, "trace.json"),
                                                memory=result.memory,
                                                fallbacks=result.fallback_events)
    if tables:
        with store.lock:
            cells = list(store.cells)
        result.launches_path = export_table(result.launches, os.path.join(out, "launches"))
        result.cells_path = export_table(cells, os.path.join(out, "cells"))
        result.memory_path = export_table(result.memory, os.path.join(out, "memory"))
        result.fallbacks_path = export_table(tracking.fallback_ops(), os.path.join(out, "fallbacks"))
        sites = store.sites()
        result.syncs_path = export_table(sites["syncs"], os.path.join(out, "syncs"))
        result.boundaries_path = export_table(sites["boundaries"], os.path.join(out, "boundaries"))
        result.regions_path = export_table(region_rows(cost_model(result.chip)),
                                           os.path.join(out, "regions"))
        rec = live_recording(cost_model(result.chip))
        result.advice_path = export_table(findings(rec), os.path.join(out, "advice"))
        result.trace_file_path = write_trace(rec, result.device_launches, result.memory,
                                             os.path.join(out, "trace"))
        m = metrics()
        result.runtime_path = export_table(
            [{"name": k, "value": float(v)} for k, v in m["runtime"].items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)],
            os.path.join(out, "runtime"))


def _activities() -> list:
    """CPU, and the device's events when its profiler is registered (device/csrc/profiler.cpp)."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device_profiler.registered():
        acts.append(torch.profiler.ProfilerActivity.PrivateUse1)
    return acts


@contextlib.contextmanager
def profile(out_dir: str = "neuron_profile", *, path: str | None = None, trace: bool = True,
            tables: bool = True):
    """Profile the block; writes ``trace.json`` and the tables under ``out_dir``
    (``path=`` is the same directory, by keyword; ``trace=False, tables=False`` writes nothing)."""
    from .. import runtime
    out_dir = path or out_dir
    if trace or tables:
        os.makedirs(out_dir, exist_ok=True)
    result = Profile(out_dir)
    model = cost_model(result.chip)
    costs = OpCosts()
    sampler = Sampler(PROFILE_SAMPLE_HZ, record=False)
    sampler.listeners.append(result.memory.append)
    t0 = time.time()
    sampler.tick()
    sampler.start()
    try:
        with torch.profiler.profile(activities=_activities()) as prof:
            with costs:      # every op priced on the modelled chip (estimate.OpCosts)
                try:
                    yield result
                finally:
                    runtime.sync("profile-end")
    finally:
        sampler.stop()
        sampler.tick()
    result.prof = prof
    result.device_launches = device_launches()
    result.wall_s = time.time() - t0
    with store.lock:    # by time, not index: the record buffers are rings
        result.launches = [dict(r) for r in store.launches if r["t"] >= t0]
        result.fallback_events = [dict(e) for e in store.fallback_events if e["t"] >= t0]
    annotate(result.launches, model)
    result.modelled = price(costs.timeline, model)
    result.modelled["ops"] = sum(1 for e in costs.timeline if e[0] == "op")
    _write(result, trace, tables)
