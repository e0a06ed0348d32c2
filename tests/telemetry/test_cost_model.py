"""The Trainium cost model on textbook cases, and ``estimate`` on code whose launches we know.

Expected figures are computed here from the published parameters by hand (the roofline), not
read back from the model: a 1 GiB elementwise op moves 2 GiB through HBM (read + write); a
large bf16 matmul is compute-bound at 2*M*N*K FLOPs over 667 TFLOP/s.
"""
import math

import pytest
import torch

import neuron_lab
from neuron_lab.runtime import knobs
from neuron_lab.telemetry.cost_model import op_cost

GiB = 1 << 30
aten = torch.ops.aten


def test_published_parameters_and_their_sources():
    m = neuron_lab.cost_model("trn2")
    p = m.params
    assert p.hbm_bytes == 96 * GiB and p.hbm_bytes_per_s == 2.9e12
    assert p.peak_flops["bfloat16"] == 667e12 and p.peak_flops["float32"] == 181e12
    assert "2.9 TB/s" in p.sources["hbm_bytes_per_s"] and "667" in p.sources["peak_flops"]
    assert "launch_overhead_s" in p.assumptions and "launch_overhead_s" not in p.sources
    t3 = neuron_lab.cost_model("trn3").params
    assert t3.hbm_bytes == 144 * GiB and t3.hbm_bytes_per_s == 4.9e12
    assert "peak_flops" in t3.assumptions
    assert m.describe()["label"] == "a model, not a measurement"
    with pytest.raises(ValueError, match="unknown chip 'trn9'.*trn2, trn3"):
        neuron_lab.cost_model("trn9")


def test_1gib_elementwise_is_2gib_over_hbm_bandwidth():
    m = neuron_lab.cost_model("trn2")
    x = torch.empty(GiB // 4, dtype=torch.float32, device="meta")     # 1 GiB
    c = op_cost(aten.neg.default, (x,), {}, aten.neg.default(x))
    assert c.bytes == 2 * GiB
    expected = 2 * GiB / 2.9e12                                          # 0.740 ms
    assert m.launch_s(c) == pytest.approx(expected + m.params.launch_overhead_s, rel=1e-9)
    assert m.launch_s(c) == pytest.approx(expected, rel=0.03)            # overhead is small here


def test_large_bf16_matmul_is_flops_over_667_tflops():
    m = neuron_lab.cost_model("trn2")
    n = 16384
    a = torch.empty(n, n, dtype=torch.bfloat16, device="meta")
    c = op_cost(aten.mm.default, (a, a), {}, aten.mm.default(a, a))
    assert c.flops == 2 * n ** 3 and c.dtype == "bfloat16"
    assert c.bytes == 3 * n * n * 2
    assert m.launch_s(c) == pytest.approx(2 * n ** 3 / 667e12, rel=0.01)   # 13.2 ms, compute-bound
    f32 = torch.empty(n, n, dtype=torch.float32, device="meta")
    c32 = op_cost(aten.mm.default, (f32, f32), {}, aten.mm.default(f32, f32))
    assert m.launch_s(c32) == pytest.approx(2 * n ** 3 / 181e12, rel=0.01)


def test_tiny_ops_are_launch_bound():
    m = neuron_lab.cost_model("trn2")
    x = torch.empty(16, device="meta")
    c = op_cost(aten.add.Tensor, (x, x), {}, aten.add.Tensor(x, x))
    assert m.launch_s(c) == pytest.approx(m.params.launch_overhead_s, rel=1e-3)


def _loop(x, steps=12):
    for _ in range(steps):
        y = ((x * 2 + 1).relu() - x).abs()
        y.sum().item()


def test_estimate_eager_vs_adaptive_counts_launches_and_fusion():
    x = torch.randn(256, 256, device="neuron")
    with knobs.COMPILE.scoped(False):
        r = neuron_lab.estimate(_loop, x)
    e, a = r["eager"], r["adaptive"]
    ops_per_step = 7                     # mul, add, relu, sub, abs, sum, item
    assert e["ops"] == a["ops"] == 12 * ops_per_step
    assert e["launches"] == e["ops"]     # eager: one launch per op
    # adaptive, steady state (issue 44): the second call finds every step's region (6 ops)
    # recognised: one program per step; .item() is a launch of its own. Compiling is off, so
    # the fused launches are the model's ("modelled"); the third call launches as the second
    assert a["launches"] == 12 * 2
    assert a["steady"] == "modelled" and a["calls"] == 3
    # the cold first call, reported apart: its first step records (per-op), later steps launch
    first = a["first_call"]
    assert first["launches"] == ops_per_step + 11 * 2
    assert first["modelled_s"] > a["modelled_s"]
    assert a["flops"] == e["flops"]
    assert a["bytes"] < e["bytes"]       # intermediates stay on chip
    assert a["modelled_s"] < e["modelled_s"] and r["speedup"] > 2
    assert e["host_s"] > 0 and a["host_s"] > 0
    assert a["modelled_as_run_s"] == pytest.approx(e["modelled_s"])    # nothing compiled
    elem = 256 * 256 * 4
    # eager: mul, add, relu, sub, abs each read and write (sub reads two); sum reads one
    per_step = elem * (2 + 2 + 2 + 3 + 2 + 1) + 4 + 4
    assert e["bytes"] == 12 * per_step


def test_cell_records_and_profile_show_host_and_modelled(tmp_path):
    from neuron_lab.telemetry import cells
    x = torch.randn(128, 128, device="neuron")
    with knobs.COMPILE.scoped(False):
        cells.start("c-model")
        _loop(x, 6)
        rec = cells.end()
        assert rec["modelled_ops"] == 5 * 6 and rec["modelled_s"] > 0
        m = neuron_lab.cost_model("trn2")
        one_region = 15e-6 + (2 * 128 * 128 * 4 + 4) / 2.9e12     # x read twice, the sum written
        assert rec["modelled_s"] == pytest.approx(5 * one_region, rel=1e-6)
        assert math.isclose(m.params.launch_overhead_s, 15e-6)
        with neuron_lab.profile(str(tmp_path), trace=False, tables=True) as prof:
            _loop(x, 3)
    assert prof.modelled["ops"] == 3 * 7 and prof.modelled["modelled_s"] > 0
    read = neuron_lab.telemetry.read_table
    rows = read(prof.launches_path)
    assert rows and all(r["modelled_s"] > 0 and r["bytes"] > 0 for r in rows)
    here = f"test_cost_model.py:{_loop.__code__.co_firstlineno + 3}"       # the .item() line
    syncs = read(prof.syncs_path)
    assert any(r["reason"] == "item" and r["location"].endswith(here) for r in syncs)
    regions = read(prof.regions_path)
    reg = next(r for r in regions if r["location"].endswith(here))
    assert reg["fused_modelled_s"] < reg["per_op_modelled_s"] and reg["ops"] == 6
    advice = read(prof.advice_path)
    assert {"kind", "where", "message", "fix", "modelled_s", "count"} <= set(advice[0])
    assert any(a["kind"] == "region-never-fuses" and a["where"].endswith(here) for a in advice)
