"""PyTorch's OpInfo database as the oracle: the representative subset in both modes (the full
sweep is `slow`; `python -m neuron_lab.testing.opinfo --full` writes docs/opinfo.md)."""
import pytest

from neuron_lab.runtime import knobs
from neuron_lab.testing import opinfo


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
def test_representative_subset(mode):
    with knobs.COMPILE.scoped(False):
        results = opinfo.sweep(full=False, mode=mode)
    r = opinfo.rates(results)
    failures = [(x["name"], x["reason"]) for x in results if "fail" in (x["forward"], x["backward"])]
    assert r["forward"]["total"] >= 60
    assert r["forward"]["rate"] >= 0.95, failures
    assert r["backward"]["rate"] >= 0.90, failures


@pytest.mark.slow
def test_full_sweep():
    r = opinfo.rates(opinfo.sweep(full=True))
    assert r["forward"]["rate"] >= 0.95 and r["backward"]["rate"] >= 0.90, r
