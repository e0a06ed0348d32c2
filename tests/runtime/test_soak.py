"""Soak: device memory, live storages and Python objects stay flat over an adaptive training run.

Default: 400 steps, sampled every 100 (a few seconds). ``-m slow``: one hour, sampled every
minute (docs/reliability.md has the figures of a run).
"""
import pytest

from neuron_lab.testing import soak


def _flat(samples, warm: int, objects_slack: float):
    after = samples[warm:]
    assert len(after) >= 2, samples
    first = after[0]
    for s in after[1:]:
        assert s["allocated"] == first["allocated"], samples
        assert s["live_storages"] == first["live_storages"], samples
        assert s["regions"] == first["regions"], samples
        assert s["gc_objects"] <= first["gc_objects"] * (1 + objects_slack), samples


def test_short_soak_is_flat():
    samples = soak.run(seconds=600, max_steps=400, every_steps=100)
    _flat(samples, warm=2, objects_slack=0.01)


@pytest.mark.slow
def test_one_hour_soak_is_flat(tmp_path):
    samples = soak.run(seconds=3600, every=60, out=str(tmp_path / "soak.json"))
    _flat(samples, warm=5, objects_slack=0.01)
