"""Trainium's dtype rules: float64/complex fall back to the host, recorded with the user's line;
``set_fallback("error")`` raises naming op, device and fix; ``"warn"`` warns once per op+line.

Locations are checked against this file's own lines (found by a marker comment), so the test
proves the fallback is attributed to the user's code, not to torch or neuron_lab.
"""
import os
import warnings

import pytest
import torch

import neuron_lab
from neuron_lab.device import config
from neuron_lab.device.kernels import UnsupportedDtypeError


def line_of(marker):
    """``file:line`` of the marked line, named as tracking names files (relative to the cwd)."""
    for i, line in enumerate(open(__file__), 1):
        if marker in line and "line_of(" not in line:
            rel = os.path.relpath(__file__)
            return f"{os.path.basename(rel) if rel.startswith('..') else rel}:{i}"
    raise AssertionError(marker)


def row(op):
    return next(r for r in neuron_lab.fallback_ops() if r["op"] == op)


def test_float64_runs_on_host_and_is_recorded_at_the_users_line(any_mode):
    x = torch.ones(3, device="neuron", dtype=torch.float64)
    y = x.sum()  # MARK-SUM
    assert y.dtype == torch.float64 and y.device.type == "neuron" and y.item() == 3.0
    r = row("aten::sum")
    assert r["reason"] == "float64 is not supported by Trainium" and r["count"] == 1
    assert r["locations"] == [line_of("MARK-SUM")]
    assert r["source"][line_of("MARK-SUM")].startswith("y = x.sum()")
    for _ in range(3):
        x.sum()  # MARK-LOOP
    r = row("aten::sum")
    assert r["count"] == 4 and r["locations"][0] == line_of("MARK-LOOP")   # most frequent first


@pytest.mark.parametrize("make", [
    lambda: torch.ones(2, device="neuron").double(),
    lambda: torch.zeros(2, dtype=torch.float64, device="neuron"),
    lambda: torch.ones(2, device="neuron").to(torch.complex64),
    lambda: torch.ones(2, dtype=torch.complex128, device="neuron") * 2,
    lambda: torch.tensor([1.0], dtype=torch.float64).to("neuron") + 1])
def test_float64_and_complex_are_fallbacks(make, any_mode):
    t = make()
    assert t.device.type == "neuron" and (t.dtype == torch.float64 or t.is_complex())
    neuron_lab.sync()
    reasons = {r["reason"] for r in neuron_lab.fallback_ops()}
    assert reasons and all("not supported by Trainium" in why for why in reasons)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8,
                                   torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool])
def test_supported_dtypes_run_on_the_device(dtype, any_mode):
    a = torch.ones(4, device="neuron", dtype=dtype)
    b = (a + a) if dtype != torch.bool else (a | a)
    (b == b).all().item()
    assert neuron_lab.fallback_ops() == []
    assert neuron_lab.executed_ops()


def test_float8_storage_runs_on_the_device(any_mode):
    t = torch.ones(4, device="neuron").to(torch.float8_e4m3fn)
    assert t.dtype == torch.float8_e4m3fn and torch.equal(t.float().cpu(), torch.ones(4))
    assert neuron_lab.fallback_ops() == []


def test_backward_fallbacks_point_at_the_backward_call(any_mode):
    x = torch.ones(3, device="neuron", dtype=torch.float64, requires_grad=True)
    y = (x * 2).sum()
    y.backward()  # MARK-BACKWARD
    locs = {loc for r in neuron_lab.fallback_ops() for loc in r["locations"]}
    assert line_of("MARK-BACKWARD") in locs and "<unknown>:0" not in locs


def test_error_policy_names_op_device_dtype_fix_and_line(any_mode):
    x = torch.ones(3, device="neuron")
    d = torch.ones(3, device="neuron", dtype=torch.float64)
    with config.FALLBACK.scoped("error"):
        with pytest.raises(UnsupportedDtypeError) as e:
            x.double()  # MARK-ERROR
        msg = str(e.value)
        for part in ("aten::_to_copy", "neuron:0", "float64", ".float()", line_of("MARK-ERROR"),
                     "set_fallback('host')"):
            assert part in msg, part
        assert isinstance(e.value, RuntimeError)
        with pytest.raises(RuntimeError, match="aten::add"):
            x + d                                       # through a binary operator too
        with pytest.raises(RuntimeError, match="view_as_real"):
            torch.zeros(2, dtype=torch.complex64, device="neuron")
        assert torch.equal(x.cpu(), torch.ones(3))      # untouched
    assert neuron_lab.get_fallback() == "host"


def test_warn_policy_warns_once_per_op_and_line(any_mode):
    x = torch.ones(3, device="neuron", dtype=torch.float64)
    with config.FALLBACK.scoped("warn"), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            x.abs()  # MARK-WARN-1
        x.abs()  # MARK-WARN-2
        x.neg()  # MARK-WARN-1 line's neighbour, another op
    msgs = [str(m.message) for m in w if issubclass(m.category, RuntimeWarning)]
    abs_msgs = [m for m in msgs if "aten::abs" in m]
    assert len(abs_msgs) == 2
    assert line_of("MARK-WARN-1") in abs_msgs[0] and line_of("MARK-WARN-2") in abs_msgs[1]
    assert sum("aten::neg" in m for m in msgs) == 1
    assert row("aten::abs")["count"] == 4                # still recorded every time


def test_set_fallback_api_and_env(monkeypatch):
    neuron_lab.set_fallback("warn")
    try:
        assert neuron_lab.get_fallback() == "warn"
    finally:
        config.FALLBACK.reset()
    with pytest.raises(ValueError, match="NEURON_LAB_FALLBACK"):
        neuron_lab.set_fallback("sometimes")
    monkeypatch.setenv("NEURON_LAB_FALLBACK", "error")
    config.FALLBACK.refresh()
    try:
        assert neuron_lab.get_fallback() == "error"
    finally:
        monkeypatch.delenv("NEURON_LAB_FALLBACK")
        config.FALLBACK.refresh()
    assert neuron_lab.get_fallback() == "host"


def test_random_ops_are_recorded_as_host_rng(any_mode):
    torch.randn(3, device="neuron")
    torch.rand(2, device="neuron")
    ops = {r["op"]: r for r in neuron_lab.fallback_ops()}
    assert "aten::randn" in ops and "aten::rand" in ops
    assert "host generator" in ops["aten::randn"]["reason"]


def test_executed_ops_and_clear(any_mode):
    x = torch.ones(4, device="neuron")
    for _ in range(3):
        x = x * 2
    x.sum().item()
    ops = neuron_lab.executed_ops()
    assert ops["aten::mul.Tensor"] == 3 and ops["aten::ones"] == 1
    assert all(k.startswith("aten::") for k in ops)
    torch.ones(1, device="neuron", dtype=torch.float64)
    neuron_lab.clear_op_tracking()
    assert neuron_lab.executed_ops() == {} and neuron_lab.fallback_ops() == []
