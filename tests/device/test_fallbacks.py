"""Trainium dtype rules, fallback records with the user's line, sync points, op tracking."""
import warnings

import pytest
import torch

import neuron_lab
from neuron_lab.device import config, tracking


@pytest.fixture(autouse=True)
def clean():
    with neuron_lab.mode("eager"):
        neuron_lab.clear_op_tracking()
        yield


def _line_of(marker):
    for i, line in enumerate(open(__file__), 1):
        if marker in line:
            return f"test_fallbacks.py:{i}"


def test_float64_falls_back_with_source_line():
    x = torch.ones(3, device="neuron", dtype=torch.float64)
    y = x.sum()  # MARK-SUM
    assert y.dtype == torch.float64 and y.item() == 3.0
    row = next(r for r in neuron_lab.fallback_ops() if r["op"] == "aten::sum")
    assert "float64" in row["reason"] and row["count"] == 1
    assert row["locations"][0].endswith(_line_of("MARK-SUM"))
    neuron_lab.clear_op_tracking()
    assert neuron_lab.fallback_ops() == [] and neuron_lab.executed_ops() == {}


def test_error_policy_names_op_device_and_fix():
    x = torch.ones(3, device="neuron")
    d = torch.ones(3, device="neuron", dtype=torch.float64)
    with config.FALLBACK.scoped("error"):
        with pytest.raises(RuntimeError) as e:
            x.double()
        msg = str(e.value)
        assert "neuron:0" in msg and "float64" in msg and ".float()" in msg
        assert torch.equal(x.cpu(), torch.ones(3))     # untouched
        with pytest.raises(RuntimeError, match="aten::add"):
            x + d                                       # through a binary operator too


def test_warn_policy_warns_once_per_location():
    x = torch.ones(3, device="neuron", dtype=torch.float64)
    with config.FALLBACK.scoped("warn"), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            x.abs()
    assert sum("aten::abs" in str(m.message) for m in w) == 1


def test_complex_is_a_fallback_and_float32_is_not():
    torch.ones(2, device="neuron", dtype=torch.complex64).abs()
    torch.ones(2, device="neuron").abs()
    rows = neuron_lab.fallback_ops()
    assert any("complex64" in r["reason"] for r in rows)
    assert not any("float32" in r["reason"] for r in rows)


def test_sync_points_are_counted():
    x = torch.tensor([0.0, 1.0, 2.0, 1.0], device="neuron")
    x.sum().item()
    x.cpu()
    x.tolist()
    x.nonzero()
    x[x > 0.5]
    torch.masked_select(x, x > 0.5)
    torch.unique(x)
    s = tracking.counters()["syncs"]
    assert s["item"] >= 1 and s["cpu"] >= 2 and s["data-dependent"] >= 4, s


def test_executed_ops_counts():
    x = torch.ones(4, device="neuron")
    for _ in range(3):
        x = x * 2
    assert neuron_lab.executed_ops()["aten::mul.Tensor"] == 3
