"""The process's parallel-op canary: is the OpenMP runtime as fast at a run's end as at its start?

Every peer runs in the benchmark's one process, so a thread one peer leaves behind can slow the
others. The known way: a thread other than the user's that runs parallel ATen work starts a
second OpenMP thread pool, and libgomp, seeing more OpenMP threads than CPUs, stops spinning its
idle workers, so every parallel region of the process pays a futex wake and sleep from then on
(docs/benchmarks.md, "Known limits"). That doubled CPU eager's W6 step on the all-cores budget
while the adaptive runtime launched on a thread of its own.

The canary times a small parallel op, ``torch.add`` of two 64 K-float tensors (two chunks of
ATen's grain, so one parallel region over two threads where the budget has them; a few
microseconds of work, so a futex hand-off shows several times over), at the run's start, before
any peer is set up, and at its end. ``check`` says when the end is more than ``LIMIT`` times the
start; the report prints both and that warning.
"""
from __future__ import annotations

import torch

from .harness import warm

N = 1 << 16
LIMIT = 1.5


def parallel_op_us(repeats: int = 4000) -> float:
    """Median µs of ``torch.add(a, b, out=c)`` on ``N`` floats with torch's intra-op threads
    (``harness.warm``: the later half of ``repeats`` timed calls)."""
    a, b, c = torch.rand(N), torch.rand(N), torch.empty(N)
    return warm(lambda: torch.add(a, b, out=c), 0.0, min_iters=repeats) * 1e6


def check(start_us: float | None, end_us: float | None) -> str | None:
    """A warning when the canary ran more than ``LIMIT`` times slower at the end of the run."""
    if not start_us or not end_us or end_us <= LIMIT * start_us:
        return None
    return (f"the parallel-op canary took {end_us / start_us:.1f}x as long at the run's end as "
            f"at its start ({start_us:.1f} -> {end_us:.1f} us): a peer may have left a thread "
            f"that slows the process's OpenMP work (docs/benchmarks.md, 'Known limits'); "
            f"the peers measured after it are slowed")
