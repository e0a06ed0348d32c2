"""Everyday training-script idioms, as people paste them from PyTorch tutorials, run on CPU and
on ``neuron`` and compared.

Each idiom is a function ``idiom(dev) -> dict`` written once for any device (the only
device-specific words are the ones a user writes: ``device=dev``, ``torch.autocast(dev)``,
``GradScaler(dev)``); what it returns (losses, weights, gradients, flags) must equal CPU's:
**bitwise** in ``eager`` and in ``adaptive`` with per-op replay (the device runs CPU's kernels),
within ``FUSED_TOL`` when the adaptive runtime runs fused programs. Tensors come back to the
host for comparison; a flag such as "the parameter is still the tied one" compares as a value.

``python -m neuron_lab.testing.compat`` runs them into ``docs/compatibility.md``.

The catalogue lives in this package's modules by theme (``data_and_precision``, ``utilities``,
``functional_and_random``, ``layers``, ``modules``; shared pieces in ``base``); importing them
registers each idiom (``@idiom``) in the order the compatibility table lists them.
"""
from __future__ import annotations

import math

import torch

# the table's order is the order these register their idioms in
from . import data_and_precision  # noqa: F401
from . import utilities  # noqa: F401
from . import functional_and_random  # noqa: F401
from . import layers  # noqa: F401
from . import modules  # noqa: F401
from .base import FUSED_TOL, IDIOMS, KNOWN, Idiom, idiom, tol  # noqa: F401


def _flat(r) -> list:
    leaves, spec = torch.utils._pytree.tree_flatten(r)
    return [(x.detach().cpu(), x.device.type, x.dtype) if isinstance(x, torch.Tensor) else x
            for x in leaves], spec


def compare(cpu, dev, dev_type: str, exact: bool) -> str:
    """'' when ``dev``'s results equal ``cpu``'s, else the first difference."""
    (a, sa), (b, sb) = _flat(cpu), _flat(dev)
    if sa != sb:
        return f"different result structure: {sb} vs CPU {sa}"
    for i, (x, z) in enumerate(zip(a, b)):
        if type(x) is tuple:
            t, _, dt = x
            u, where, dt2 = z
            if where != dev_type:
                return f"result {i} is on {where}, not {dev_type}"
            if dt != dt2 or t.shape != u.shape:
                return f"result {i}: {dt2} {tuple(u.shape)} vs CPU {dt} {tuple(t.shape)}"
            same = torch.equal(t, u) if exact else torch.allclose(
                t.float(), u.float(), equal_nan=True, **tol(t.dtype))
            if not same:
                return f"result {i} differs by {(t.float() - u.float()).abs().max().item():.3g}"
        elif x != z and not (exact is False and isinstance(x, float)
                             and math.isclose(x, z, rel_tol=FUSED_TOL["rtol"])):
            return f"result {i}: {z!r} vs CPU {x!r}"
    return ""


def run(name: str, mode: str, compile: bool = False):
    """Run idiom ``name`` on CPU and on neuron in ``mode``; a ``zoo.Verdict``."""
    import neuron_lab

    from ..zoo import Verdict, device_mode, with_failed_regions
    fn, exact = IDIOMS[name].fn, IDIOMS[name].exact and not compile
    cpu = fn("cpu")
    label = mode + ("+fused" if compile else "")
    try:
        with device_mode(mode, compile):
            dev = fn("neuron")
            neuron_lab.sync()
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return Verdict(name, label, False, f"{type(e).__name__}: {first[:300]}")
    why = compare(cpu, dev, "neuron", exact=exact)
    v = Verdict(name, label, not why, why)
    return with_failed_regions(v) if compile else v
