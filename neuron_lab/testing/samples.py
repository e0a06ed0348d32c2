"""Paired OpInfo sample inputs: the same sample on CPU (the reference) and on ``neuron``.

Why generate twice instead of moving the CPU sample: OpInfo sample functions put some tensors on
CPU on purpose (``tensor_split``'s index tensor must be a CPU tensor on every device, as on CUDA),
and factory samples carry ``device=`` in their kwargs. Moving every tensor would test a call no
user makes. So, as PyTorch's device-generic tests do, the sample function runs once per device,
each time after ``torch.manual_seed(seed)``: the device's random ops draw from the host generator,
so both runs get the same values. Each pair is checked for equal values; where they differ (a
sample function that draws differently per device) the CPU sample is moved instead, which is what
``op.sample_inputs('cpu', ...)`` + ``.to('neuron')`` would give.

Speed: every ``sample_inputs`` call crawls the stack (``extract_test_fn``, ``inspect.stack()``,
which reads the source of every frame) looking for a ``unittest.TestCase`` to key the seed on; it
finds none here (pytest functions, the CLI) and returns None, but costs ~2/3 of the sweep's time,
more under pytest's deep stacks. ``_no_stack_crawl`` returns that None directly: same samples.
And ``torch.manual_seed`` (which OpInfo calls before every sample) formats the stack three times
to queue seeds for CUDA/XPU/MTIA, uninitialised here (~10 ms); ``seed`` seeds only the generators
a sample can draw from: the host's, Python's, NumPy's and the device's.
"""
from __future__ import annotations

import contextlib
import itertools
import random

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = "neuron"


def _parts(s) -> tuple:
    return (s.input, s.args, s.kwargs)


def move(x, dev: str):
    """Detached copies on ``dev`` (always new tensors) keeping ``requires_grad``."""
    def one(t):
        if not isinstance(t, torch.Tensor):
            return t
        c = t.detach().to(dev, copy=True)
        return c.requires_grad_(t.requires_grad) if c.is_floating_point() or c.is_complex() else c
    return tree_map(one, x)


def same(a, b) -> bool:
    """Same structure, devices (by role) and values: ``b``'s neuron tensors equal ``a``'s CPU ones."""
    fa, sa = tree_flatten(a)
    fb, sb = tree_flatten(b)
    if sa != sb:
        return False
    for x, y in zip(fa, fb):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            y = y.detach().cpu()
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x.detach(), y) \
                    and not (x.is_floating_point() and torch.equal(x.isnan(), y.isnan())
                             and torch.equal(x.detach().nan_to_num(), y.nan_to_num())):
                return False
        elif isinstance(x, torch.device) or isinstance(y, torch.device) or (x, y) == ("cpu", DEVICE):
            continue
        elif x != y and not (x != x and y != y):   # NaN scalars are equal here
            return False
    return True


def expected_device(parts) -> str | None:
    """Where this sample's tensor outputs belong: an explicit ``device=`` kwarg, else ``neuron``
    when it has a neuron tensor or names the device anywhere, else no expectation."""
    dev = parts[2].get("device") if isinstance(parts[2], dict) else None
    if dev is not None:
        return torch.device(dev).type
    if any(isinstance(x, torch.Tensor) and x.device.type == DEVICE
           or isinstance(x, (str, torch.device)) and str(x).startswith(DEVICE)
           for x in tree_flatten(parts[:3])[0]):
        return DEVICE
    return None


def seed(s: int = 0) -> None:
    torch.default_generator.manual_seed(s)
    torch.neuron.manual_seed_all(s)
    random.seed(s)
    np.random.seed(s)


@contextlib.contextmanager
def _no_stack_crawl():
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core
    saved = common_utils.extract_test_fn, core.extract_test_fn, common_utils.set_rng_seed
    common_utils.extract_test_fn = core.extract_test_fn = lambda: None
    common_utils.set_rng_seed = lambda s=None: seed(common_utils.SEED if s is None else s)
    try:
        yield
    finally:
        common_utils.extract_test_fn, core.extract_test_fn, common_utils.set_rng_seed = saved


def pairs(op, dtype: torch.dtype, requires_grad: bool, limit: int | None, seed: int = 0):
    """Yield (cpu_parts, neuron_parts, how): how is "generated", or "moved: <why>".

    ``*_parts`` are ``(input, args, kwargs, output_process_fn_grad)``.
    """
    with _no_stack_crawl():
        out = list(_pairs(op, dtype, requires_grad, limit, seed))
    yield from out


def _pairs(op, dtype, requires_grad, limit, s):
    seed(s)
    cpu = list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=requires_grad), limit))
    why = "values differ"
    try:
        seed(s)
        dev = list(itertools.islice(op.sample_inputs(DEVICE, dtype, requires_grad=requires_grad),
                                    limit))
    except Exception as e:  # noqa: BLE001 - reported: it may be a device bug
        dev, why = [], f"sample_inputs('{DEVICE}') raised {type(e).__name__}: {_line(e)}"
    for i, c in enumerate(cpu):
        d = dev[i] if i < len(dev) else None
        cp = _parts(c)
        proc = c.output_process_fn_grad
        if d is not None and same(cp, _parts(d)):
            yield cp + (proc,), _parts(d) + (d.output_process_fn_grad,), "generated"
        else:
            yield cp + (proc,), move(cp, DEVICE) + (proc,), f"moved: {why}"


def _line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]
