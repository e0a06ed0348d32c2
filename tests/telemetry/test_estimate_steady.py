"""estimate() answers for the steady state (issue 44), and reports the cold first call apart."""
import pytest
import torch

import neuron_lab
from neuron_lab.runtime import knobs


def _chain(x):
    for _ in range(64):
        x = x * 1.0001
    return x.sum().item()


def test_elementwise_chain_steady_state_is_one_fused_launch():
    x = torch.randn(64, device="neuron")
    with knobs.COMPILE.scoped(False):
        r = neuron_lab.estimate(_chain, x)
    e, a = r["eager"], r["adaptive"]
    assert e["launches"] == e["ops"] == 66                 # 64 muls, sum, item
    first = a["first_call"]
    assert first["launches"] == 66                         # nothing recognised yet: per-op
    assert a["launches"] == 2 and a["steady"] == "modelled"     # one region + the .item()
    assert a["modelled_s"] < first["modelled_s"] / 10
    assert r["speedup"] > 10 and r["chip"] == neuron_lab.get_chip()


@pytest.mark.slow
def test_wait_compiles_reaches_the_compiled_steady_state():
    x = torch.randn(64, device="neuron")
    r = neuron_lab.estimate(_chain, x, wait_compiles=True, max_calls=8)
    assert r["adaptive"]["steady"] in ("compiled", "modelled")
    assert r["adaptive"]["launches"] == 2
