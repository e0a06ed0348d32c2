"""``NEURON_LAB_VERIFY=1``: a fused program's first launches are checked against per-op replay.

For each of a region's first ``NEURON_LAB_VERIFY_LAUNCHES`` (3) fused launches, the program runs
on copies of its inputs, then the region is replayed per-op for real (the user receives the
per-op values, so a miscompile never reaches them while it is being checked), and the program's
outputs and input mutations are compared with the per-op ones (``allclose`` at the tolerance
of the dtype below: fused reductions may reorder sums; NaN equals NaN). A mismatch marks the
region per-op for good (``status`` "failed", ``error`` naming the op, the output and the
largest difference), counts ``verify_mismatches`` in ``runtime.stats()``, emits a ``compile``
event with outcome "failed" (``metrics()["compiles"]``) and warns (RuntimeWarning). A region
whose checks all pass runs as the policy decides, unchecked, from then on.
"""
from __future__ import annotations

import time
import warnings

import torch

from ..device import events
from . import fused, pending, replay, worker
from .status import Status

Tensor = torch.Tensor
_TOL = {torch.float16: (1e-2, 1e-3), torch.bfloat16: (1.6e-2, 1e-2), torch.float32: (1e-4, 1e-5)}


def launch(region, records: list, stats: dict) -> float | None:
    """A checked fused launch; returns the per-op seconds, or None if the program cannot serve
    this launch (the caller replays per-op as usual)."""
    plan = region.plan
    inputs = fused.launch_inputs(region.program, plan, records)
    if inputs is None:
        return None
    copies = [t.clone() for t in inputs]          # the program may write into its inputs
    try:
        outs = region.program(*copies)
    except Exception as e:  # noqa: BLE001 - a failing program means: per-op for good
        region.move(Status.FAILED, f"run: {type(e).__name__}: {e}")
        worker._add("compiles_failed", 1, stats)
        return None
    t0 = time.perf_counter()
    replay.per_op(records)                         # the values the user receives
    dt = time.perf_counter() - t0
    region.verified += 1
    bad = _first_mismatch(region, records, plan, outs, inputs, copies)
    if bad is not None:
        region.move(Status.FAILED, f"verify: {bad}")
        stats["verify_mismatches"] = stats.get("verify_mismatches", 0) + 1
        events.emit(events.COMPILE, region=region.id, seconds=0.0, outcome="failed",
                    error=region.error)
        warnings.warn(f"neuron_lab: the fused program of region {region.id} "
                      f"({', '.join(region.names[:4])}{', ...' if region.ops > 4 else ''}) "
                      f"disagrees with per-op execution: {bad}. The region runs per-op from now "
                      f"on; the values returned were computed per-op.", RuntimeWarning,
                      stacklevel=2)
    return dt


def _first_mismatch(region, records, plan, outs, inputs, copies) -> str | None:
    for (i, k), h in zip(plan.outputs, outs):
        pair = records[i].outs[k]
        tgt = pending.alive(pair) if pair is not None else None
        ref = tgt.__dict__.get("_d") if isinstance(tgt, Tensor) else None
        if isinstance(ref, Tensor):
            why = _differs(h, ref)
            if why:
                return f"output {k} of op {i + 1} ({region.names[i]}): {why}"
    for j, (ref, got) in enumerate(zip(inputs, copies)):
        why = _differs(got, ref)
        if why:
            return f"input {j} as written by the region: {why}"
    return None


def _differs(got: Tensor, ref: Tensor) -> str | None:
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return f"shape/dtype {tuple(got.shape)}/{got.dtype} vs {tuple(ref.shape)}/{ref.dtype}"
    if not (got.is_floating_point() or got.is_complex()):
        return None if torch.equal(got, ref) else "values differ"
    rtol, atol = _TOL.get(got.dtype, (1e-7, 1e-9))
    if torch.allclose(got, ref, rtol=rtol, atol=atol, equal_nan=True):
        return None
    diff = (got.double() - ref.double()).abs().nan_to_num(float("inf")).max().item()
    return f"max abs difference {diff:.3g} (rtol {rtol:g}, atol {atol:g})"
