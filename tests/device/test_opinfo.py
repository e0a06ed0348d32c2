"""PyTorch's OpInfo database as the oracle (``neuron_lab.testing.opinfo``).

The representative subset (~120 op_db entries, ``SUBSET``) runs here in both modes: every sample
in eager mode, where each entry must pass (bitwise), the first 8 samples per entry in adaptive
mode, held to the issue's rates. The harness itself is tested too: an op that is wrong only on
``neuron`` — in value, aliasing, strides or gradient — must fail. The full sweep (every entry) is
``slow``; ``python -m neuron_lab.testing.opinfo --full`` writes docs/opinfo.md.
"""
import copy

import pytest
import torch

from neuron_lab.testing import opinfo, opinfo_report


@pytest.fixture(scope="module")
def entries():
    return {opinfo.entry_name(o): o for o in opinfo.ops(full=True)}


def _failures(results):
    return [(r["name"], r["reason"]) for r in results if "fail" in (r["forward"], r["backward"],
                                                                      r["inplace"])]


def test_representative_subset_eager_all_pass():
    results = opinfo.sweep(full=False, mode="eager")
    r = opinfo.rates(results)
    assert r["forward"]["total"] >= 100 and r["backward"]["total"] >= 90
    assert _failures(results) == []


def test_representative_subset_adaptive():
    results = opinfo.sweep(full=False, mode="adaptive", limit=8)
    r = opinfo.rates(results)
    assert r["forward"]["rate"] >= 0.95 and r["backward"]["rate"] >= 0.90, _failures(results)


def _variant(entries, name, fn):
    o = copy.copy(entries[name])
    o.op = fn
    o.inplace_variant = None
    return o


def on_neuron(t):
    return t.device.type == "neuron"


@pytest.mark.parametrize("bug,name,fn", [
    ("value", "abs", lambda x: torch.abs(x) + on_neuron(x) * 1e-7),
    ("aliasing", "t", lambda x: x.t().clone() if on_neuron(x) else x.t()),
    ("strides", "abs", lambda x: torch.abs(x).t().contiguous().t() if on_neuron(x) and x.dim() == 2
     and x.shape[0] > 1 and x.shape[1] > 1 else torch.abs(x)),
    ("device", "abs", lambda x: torch.abs(x).cpu()),
    ("grad", "abs", lambda x: torch.abs(x) if not on_neuron(x) else
     torch.abs(x.detach()) + (x - x.detach()) * 2),
])
def test_the_oracle_catches_neuron_only_bugs(entries, bug, name, fn):
    res = opinfo.check(_variant(entries, name, fn), "eager")
    col = "backward" if bug == "grad" else "forward"
    assert res[col] == "fail", res
    assert res["reasons"][col]


def test_skips_are_not_passes(entries):
    for name in ("randn", "nn.functional.dropout", "empty_like"):
        res = opinfo.check(entries[name])
        assert res["forward"] == res["backward"] == "skip" and res["reason"]
    r = opinfo.rates([opinfo.check(entries["randn"]), opinfo.check(entries["abs"])])
    assert r["forward"]["total"] == 1 and r["skipped"] == 1


def test_report_lists_every_failure_with_its_reason(entries):
    bad = opinfo.check(_variant(entries, "abs", lambda x: torch.abs(x) + on_neuron(x)), "eager")
    good = opinfo.check(entries["neg"], "eager")
    text = opinfo_report.markdown({"eager": [bad, good, opinfo.check(entries["randn"])]}, 1.0, full=False)
    assert "| forward | 1 / 2 (50.0%) |" in text
    assert "| abs | fail |" in text and "Tensor-likes are not equal" in text
    assert "random output" in text and "python -m neuron_lab.testing.opinfo --full" in text


def test_cli_writes_report_and_json(tmp_path):
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    assert opinfo.main(["--ops", "add,mm", "--mode", "both", "--report", str(md),
                        "--json", str(js)]) == 0
    text = md.read_text()
    assert "# OpInfo sweep" in text and "eager: pass / run" in text and "adaptive" in text
    assert '"name": "mm"' in js.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eager", "adaptive"])
def test_full_sweep(mode):
    r = opinfo.rates(opinfo.sweep(full=True, mode=mode))
    assert r["forward"]["rate"] >= 0.95 and r["backward"]["rate"] >= 0.90, r
