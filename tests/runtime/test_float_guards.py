"""Regions whose floats cannot be data (``lerp``'s decomposition branches on its weight,
``nan_to_num``'s schema wants a plain float) fuse with the floats specialized and guarded:
a launch with other values runs per-op, results equal CPU either way. They never fused before
(the compile failed on the unbacked SymFloat and the region stayed per-op)."""
import pytest
import torch

from neuron_lab import runtime
from neuron_lab.runtime import knobs


def _nan_to_num(a, b, v):
    return torch.nan_to_num(a.log(), v) * 2 + b


def _lerp(a, b, v):
    return torch.lerp(a, b, v).sin() * 2 + 1


@pytest.mark.parametrize("fn", [_nan_to_num, _lerp], ids=["nan_to_num", "lerp"])
def test_float_guarded_regions_fuse(fn):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, generator=g), torch.randn(64, generator=g)
    na, nb = a.to("neuron"), b.to("neuron")
    with knobs.TRIALS.scoped(0):
        for _ in range(5):
            r = fn(na, nb, 0.3)
            r.sum().item()
        torch.testing.assert_close(r.cpu(), fn(a, b, 0.3), equal_nan=True)
        (reg,) = runtime.regions()
        assert reg["status"] == "fused", reg
        fused = runtime.stats()["launches_fused"]
        assert fused >= 2
        r = fn(na, nb, 0.7)           # same region, other value: the guard sends it per-op
        r.sum().item()
        torch.testing.assert_close(r.cpu(), fn(a, b, 0.7), equal_nan=True)
        assert runtime.stats()["launches_fused"] == fused
        r = fn(na, nb, 0.3)
        r.sum().item()
        assert runtime.stats()["launches_fused"] == fused + 1
