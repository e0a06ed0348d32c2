"""The policy's rule (policy.py header): trials end once decided, medians or separated samples
decide, a region judged slower is tried again with a doubling backoff. Timings are injected
(no timed asserts): ``replay.per_op`` and ``fused.run`` report the seconds the test chooses."""
import pytest
import torch

from neuron_lab import runtime
from neuron_lab.runtime import fused, knobs, policy, replay
from neuron_lab.runtime.status import Status


def test_trial_outcome_rule():
    v = policy.trial_outcome
    assert v([1.0], [2.0], 3) is None                       # one sample each: keep sampling
    assert v([1.0], [4.0], 3) == "fused"                    # ... unless 4x apart
    assert v([4.0], [1.0], 3) == "per-op"
    assert v([1.0], [3.9], 3) is None
    assert v([1.0, 1.1], [2.0, 2.1], 3) == "fused"          # separated after 2 each
    assert v([2.0, 2.1], [1.0, 1.1], 3) == "per-op"
    assert v([1.0, 3.0], [2.0, 2.5], 3) is None             # overlapping: a third sample
    assert v([1.0, 3.0, 1.2], [2.0, 2.5, 2.2], 3) == "fused"  # medians 1.2 vs 2.2
    assert v([1.0], [2.0], 1) == "fused"


def _step(x):
    """One launch of the region (5 ops, ended by the sync)."""
    ((x * 2 + 1).sin() * 3).cos().sum()
    runtime.sync()


def _hot_region(x):
    for _ in range(3):
        _step(x)
    (r,) = [r for r in runtime.current().engine.cache.regions() if r.ops >= 4]
    return r


@pytest.fixture
def timings(monkeypatch):
    """Make per-op launches take ``t["per_op"]`` and fused ones ``t["fused"]`` (host seconds)."""
    t = {"per_op": 1.0, "fused": 2.0, "kinds": []}
    real_per_op, real_fused = replay.per_op, fused.run

    def per_op(records):
        real_per_op(records)
        t["kinds"].append("per-op")
        return t["per_op"]

    def run(region, records):
        dt = real_fused(region, records)
        if dt is None:
            return None
        t["kinds"].append("fused")
        return t["fused"]

    monkeypatch.setattr(replay, "per_op", per_op)
    monkeypatch.setattr(fused, "run", run)
    return t


def test_slower_is_revisited_with_a_doubling_backoff(timings):
    x = torch.randn(64).to("neuron")
    with knobs.TRIALS.scoped(3):
        r = _hot_region(x)
        assert r.status is Status.TRIAL
        timings["kinds"].clear()
        for _ in range(5):                    # load (fused), per-op, fused, per-op, fused
            _step(x)
        assert r.status is Status.SLOWER and r.backoff == policy.RETRY_AFTER
        assert r.program is not None          # kept for the revisit
        n = 0
        while r.status is Status.SLOWER and n < 1000:    # per-op until the backoff runs out
            _step(x)
            n += 1
        assert n == policy.RETRY_AFTER and r.status is Status.TRIAL
        timings["per_op"], timings["fused"] = 2.0, 1.0      # the load went away: fused wins
        for _ in range(5):
            _step(x)
        assert r.status is Status.FUSED
        timings["kinds"].clear()
        for _ in range(20):                   # decided: every launch fused, no more trials
            _step(x)
        assert set(timings["kinds"]) == {"fused"}


def test_backoff_doubles_when_per_op_wins_again(timings):
    x = torch.randn(64).to("neuron")
    with knobs.TRIALS.scoped(3):
        r = _hot_region(x)
        while r.status is not Status.SLOWER:
            _step(x)
        for _ in range(policy.RETRY_AFTER + 5):
            _step(x)
        assert r.status is Status.SLOWER and r.backoff == 2 * policy.RETRY_AFTER


def _chain(x):
    return ((x * 2 + 1).sin() * 3).cos() - 0.5


def test_a_launch_needing_an_output_the_program_lacks_recompiles_it():
    """Rule 7. The region compiles while the loop discards its result; then the loop keeps it.
    Before: every later launch needed a value the program does not return and ran per-op for
    good while the region said ``fused``. Now the region is compiled again returning it too."""
    x = torch.randn(64).to("neuron")
    with knobs.TRIALS.scoped(0):
        for _ in range(4):                  # compiled (needs nothing), fused
            _chain(x)
            runtime.sync()
        (reg,) = runtime.current().engine.cache.regions()
        assert reg.status is Status.FUSED and reg.plan.outputs == ()
        fused_before = reg.fused_launches
        kept = []
        for _ in range(4):                  # now the result is kept: recompiled, fused again
            kept.append(_chain(x))
            runtime.sync()
        assert reg.widened == 1 and reg.status is Status.FUSED
        assert reg.plan.outputs == ((reg.ops - 1, 0),)
        assert reg.fused_launches > fused_before
        last_fused = reg.fused_launches
        kept.append(_chain(x))
        runtime.sync()
        assert reg.fused_launches == last_fused + 1
    want = ((x.cpu() * 2 + 1).sin() * 3).cos() - 0.5
    for k in kept:
        torch.testing.assert_close(k.cpu(), want)


def test_recompiles_for_outputs_are_bounded(monkeypatch):
    """A loop that keeps a different value each launch widens the program at most WIDEN_MAX
    times; past that such launches run per-op, with right values."""
    monkeypatch.setattr(policy, "WIDEN_MAX", 1)
    x = torch.randn(64).to("neuron")

    def chain_keeping(k):
        vals = [x * 2]
        for _ in range(5):
            vals.append(vals[-1].sin() + 0.5)
        out = vals[k]
        del vals
        runtime.sync()
        return out
    with knobs.TRIALS.scoped(0):
        for _ in range(4):
            chain_keeping(5)
        (reg,) = runtime.current().engine.cache.regions()
        assert reg.status is Status.FUSED
        chain_keeping(4)                    # op 8's output is not returned: recompiled
        chain_keeping(5)
        assert reg.widened == 1 and reg.status is Status.FUSED
        assert set(reg.plan.outputs) >= {(reg.ops - 1, 0), (reg.ops - 3, 0)}
        per_op = reg.per_op_launches
        got = chain_keeping(2)              # a third value: per-op, no further recompile
        assert reg.widened == 1 and reg.per_op_launches == per_op + 1
        assert reg.status is Status.FUSED
    want = x.cpu() * 2
    for _ in range(2):
        want = want.sin() + 0.5
    torch.testing.assert_close(got.cpu(), want)
