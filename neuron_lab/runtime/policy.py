"""The adaptive policy: which regions to compile, and per launch, fused or per-op. (Whether an
op call is queued at all is ``verdict.py``'s.)

The rule (thresholds are knobs, see ``knobs.py``):
1. Never compile a region shorter than ``MIN_REGION_OPS`` ops (launch overhead of a compiled
   program, ~15-20 us on CPU, cannot pay back) or seen fewer than ``COMPILE_AFTER`` times (cold
   code would wait ~2-20 s of compile for nothing).
2. While compiling, and always for regions that are not compiled, run per-op (replay).
3. A compiled region enters a *trial*: its first fused call (which loads the program) is not
   timed; then per-op and fused launches alternate, so each pair of samples is taken under the
   same machine load (samples taken while the program was compiling are dropped: the compile
   thread was competing for the cores). The trial ends as soon as
   - each kind has ``TRIALS`` samples (3): the lower median host time wins; or
   - each kind has 2 samples (1 if ``TRIALS`` is 1) and they do not overlap (every sample of
     one kind faster than every sample of the other): that kind wins; or
   - each kind has 1 sample and one is ``CLEAR_GAP`` (4) times faster than the other: no load
     that changes between two launches in a row explains that (a 389-op BERT region: 3.7 ms
     fused, 149 ms per-op).
   So a region whose fused program is far faster pays 1 per-op launch after its compile, one
   that is clearly faster 2.
   ``TRIALS`` = 0 skips the A/B: a compiled region runs fused (tests that check fused semantics
   use it, so their counters do not depend on load).
4. A decision stays decided. ``fused`` is final. ``slower`` (per-op won) keeps its program and
   is tried again after ``backoff`` more launches (``RETRY_AFTER`` = 32 at first, doubling each
   time per-op wins again, at most 4096): a region judged slower under a transient load (a
   compile of another region, another process) gets a new trial, and one that is really slower
   costs one trial per thousands of launches.
5. A compile or run failure marks the region per-op for good and records the error.
6. Floats that were the same at the capture and at every launch before the compile are
   compiled in as constants (faster kernels), guarded at each launch; the first launch whose
   floats differ runs per-op and sends the region back to ``recorded``, to be compiled with its
   floats as data (one more compile for an lr schedule that holds its value a while, then
   moves).
7. A program returns the region's values that were alive when it was compiled. A launch that
   needs one it does not return (a result the loop discarded while the region compiled and
   keeps now: a loss logged from some step on) runs per-op and sends the region back to
   ``recorded``, to be compiled returning those values too (``Region.wanted``, the union of
   every launch's needs so far). At most ``WIDEN_MAX`` times per region: past that, such a
   launch runs per-op and the program stays for the launches it serves.

The states and their transitions are ``status.py``'s.
"""
from __future__ import annotations

import statistics

import torch

from . import compiler, fused, knobs, programs, replay, verify, worker
from .status import Status

_SAMPLES = 8


def run(region, records, needed, stats) -> tuple[float, bool]:
    """Execute a deferred region; returns (host seconds, used the fused program)."""
    status = region.status
    if status is Status.FUSED:
        return _fused_or_per_op(region, records, needed, stats)
    if status is Status.SLOWER:
        region.since_decided += 1
        if region.since_decided < region.backoff or region.program is None:
            return _per_op(region, records, stats)
        region.move(Status.TRIAL)                # revisit (rule 4)
        region.trial = 0
        status = Status.TRIAL
    if status is Status.TRIAL:
        if knobs.TRIALS.get() <= 0:              # no A/B: fused, for good
            region.move(Status.FUSED)
            return _fused_or_per_op(region, records, needed, stats)
        region.trial += 1
        if region.trial == 1:                    # first call loads the program: not a sample
            region.per_op_s.clear()              # samples from before: not under the same load
            region.fused_s.clear()
            return _fused_or_per_op(region, records, needed, stats, sample=False)
        if region.trial % 2 == 0:                # A/B under the same load: per-op turn first
            dt = _per_op(region, records, stats)
            _decide(region, stats)
            return dt
    return _fused_or_per_op(region, records, needed, stats)


def _fused_or_per_op(region, records, needed, stats, sample: bool = True) -> tuple[float, bool]:
    n = len(records)
    if region.program is not None and region.status in (Status.TRIAL, Status.FUSED):
        if not needed.issubset(region.plan.outputs_set):
            return _outputs_missing(region, records, needed, stats)
        if knobs.VERIFY.get() and region.verified < knobs.VERIFY_LAUNCHES.get():
            try:
                dt = _verified(region, records, stats)
            except fused.FloatsChanged:
                return _floats_changed(region, records, stats)
            if dt is not None:
                return dt, False
            if region.program is None:                   # the program raised
                return _per_op(region, records, stats)
        try:
            dt = fused.run(region, records)
        except fused.FloatsChanged:
            return _floats_changed(region, records, stats)
        except Exception as e:  # noqa: BLE001 - a failing program means: per-op for good
            region.move(Status.FAILED, f"run: {type(e).__name__}: {e}")
            worker._add("compiles_failed", 1, stats)
            dt = None
        if dt is not None:
            if sample:
                region.fused_s.append(dt)
                del region.fused_s[:-_SAMPLES]
            region.fused_launches += 1
            stats["launches_fused"] += 1
            stats["ops_fused"] += n
            _decide(region, stats)
            return dt, True
    return _per_op(region, records, stats)


def _floats_changed(region, records, stats) -> tuple[float, bool]:
    """Rule 6: the constant floats a program was specialized on changed. This launch runs
    per-op; the region goes back to ``recorded`` to be compiled with its floats as data."""
    region.floats_seen = False
    region.floats_before = region.program.fixed   # kept if they cannot be data
    _compile_again(region)
    return _per_op(region, records, stats)


def _compile_again(region) -> None:
    """Rules 6 and 7: drop the program; the region is compiled again from ``recorded``."""
    region.program = None
    region.trial = 0
    region.move(Status.RECORDED)


WIDEN_MAX = 4


def _outputs_missing(region, records, needed, stats) -> tuple[float, bool]:
    """Rule 7: this launch needs values the program does not return. It runs per-op; the
    region goes back to ``recorded`` to be compiled returning them too (``WIDEN_MAX`` times)."""
    if region.widened < WIDEN_MAX:
        region.widened += 1
        region.wanted = region.wanted | region.plan.outputs_set | needed
        _compile_again(region)
    return _per_op(region, records, stats)


def _verified(region, records, stats) -> float | None:
    """A checked launch (NEURON_LAB_VERIFY): the user gets per-op values; counted as per-op."""
    dt = verify.launch(region, records, stats)
    if dt is not None:
        region.per_op_launches += 1
        worker._add("launches_per_op", 1, stats)    # the user's thread counts them too
        worker._add("ops_per_op", len(records), stats)
    return dt


def _per_op(region, records, stats) -> tuple[float, bool]:
    n = len(records)
    dt = replay.per_op(records)
    region.per_op_s.append(dt)
    del region.per_op_s[:-_SAMPLES]
    region.per_op_launches += 1
    worker._add("launches_per_op", 1, stats)        # the user's thread counts them too
    worker._add("ops_per_op", n, stats)
    return dt, False


RETRY_AFTER, RETRY_MAX = 32, 4096


CLEAR_GAP = 4.0     # rule 3: one sample each decides when every sample of one kind is this
                    # many times faster than every sample of the other


def trial_outcome(fused_s: list, per_op_s: list, trials: int) -> str | None:
    """Rule 3: "fused", "per-op", or None (keep sampling)."""
    n = min(len(fused_s), len(per_op_s))
    if n >= trials:
        return "fused" if statistics.median(fused_s) <= statistics.median(per_op_s) else "per-op"
    if n >= 1:
        if min(per_op_s) >= CLEAR_GAP * max(fused_s):
            return "fused"
        if min(fused_s) >= CLEAR_GAP * max(per_op_s):
            return "per-op"
    if n >= min(2, trials):
        if max(fused_s) < min(per_op_s):
            return "fused"
        if max(per_op_s) < min(fused_s):
            return "per-op"
    return None


def _decide(region, stats) -> None:
    if region.status is not Status.TRIAL:
        return
    v = trial_outcome(region.fused_s, region.per_op_s, knobs.TRIALS.get())
    if v == "fused":
        region.move(Status.FUSED)
    elif v == "per-op":
        region.backoff = min(RETRY_MAX, region.backoff * 2) if region.backoff else RETRY_AFTER
        region.since_decided = 0
        region.move(Status.SLOWER)
        stats["compiles_slower"] += 1


def _note_floats(region, records) -> None:
    """Rule 6: remember the region's data floats while they are the same at every launch
    (``region.floats_seen``: the capture's values (``cache.Region``), or False once they
    differed)."""
    if region.floats_seen is False:
        return
    if region.floats_seen != compiler.data_floats(records):
        region.floats_seen = False


def maybe_compile(region, records, needed, stats) -> None:
    if (region.status is not Status.RECORDED or not knobs.COMPILE.get()
            or region.ops < knobs.MIN_REGION_OPS.get()):
        return
    _note_floats(region, records)
    if region.hits < knobs.COMPILE_AFTER.get() or not (knobs.SYNC_COMPILE.get()
                                                       or worker.has_room()):
        return
    try:
        graph, plan, examples = compiler.build(records, needed | region.wanted)
    except Exception as e:  # noqa: BLE001 - cannot express the region as a graph: per-op
        region.move(Status.FAILED, f"build: {type(e).__name__}: {e}")
        worker._add("compiles_failed", 1, stats)
        return
    region.plan = plan
    region.move(Status.QUEUED)
    fixed = region.floats_seen if plan.scalars and region.floats_seen else None
    build = programs.Build(compiler.largest_numel(records), region.beside_host,
                           torch.get_num_threads())
    worker.submit(region, graph, examples, stats, build, (fixed, region.floats_before))
