"""Every collective on ``neuron`` tensors, in eager and adaptive mode, against gloo on CPU
tensors, in a real 2-process group on loopback (``ranks.collectives``); plus the telemetry
each collective leaves and the region boundary it makes in adaptive mode."""
from __future__ import annotations

import pytest

from ranks import N


@pytest.fixture(scope="module")
def job(ranks):
    return ranks("ranks", "collectives")


def _checks(job):
    return {k: v for k, v in job[0].items() if k != "telemetry"} | \
        {f"rank1/{k}": v for k, v in job[1].items() if k != "telemetry"}


def test_every_collective_matches_gloo_on_cpu_in_both_modes(job):
    checks = _checks(job)
    assert len(checks) == 2 * 2 * 14
    failed = {k: v for k, v in checks.items() if v is not None}
    assert not failed, "\n".join(f"{k}:\n{v}" for k, v in failed.items())


def test_collectives_are_telemetry_with_bytes_and_time(job):
    tele = job[0]["telemetry"]
    ops = tele["ops"]
    # eager once, adaptive three times: 4 calls of each single-call check
    assert ops["all_gather"] == 4 and ops["broadcast"] == 4 and ops["all_to_all"] == 4
    assert ops["all_reduce"] == 3 * 4            # sum, max and async
    assert ops["send"] == ops["recv"] == 8       # send_recv and isend_irecv
    c = tele["counters"]
    assert c["collectives"] == sum(ops.values())
    # all_reduce's size is its buffer: 6 float32 per call
    assert c["collective_bytes"] >= 12 * N * 4 and c["collective_s"] > 0


def test_a_collective_is_a_region_boundary_in_adaptive_mode(job):
    # each adaptive check that reads deferred inputs flushes with reason "collective"
    assert job[0]["telemetry"]["flushes"].get("collective", 0) >= 14
