"""The repeated-suffix rule (runtime/repeated_suffix.py): its C ``observe`` against the Python
reference, and a long capture that calls no Python per op for it."""
import random
import sys

import pytest
import torch

import neuron_lab
from neuron_lab import runtime
from neuron_lab.runtime import core, knobs, record, repeated_suffix
from neuron_lab.runtime.segment import _Fields

ext = core.extension()


def _records(keys):
    return [record.QueuedOp(None, (), None, k, []) for k in keys]


def _cuts(observe, seg, keys, records):
    """Queue ``records`` on ``seg`` one by one, observing each as the capture does."""
    cuts = []
    for n, k in enumerate(keys):
        seg.append(records[n])
        start = observe(seg, n, k)
        cuts.append(start)
        if start >= 0:                     # the engine ends the segment at a cut
            break
    return cuts, (seg.suffix_period, seg.suffix_match, dict(seg.suffix_last))


@pytest.mark.skipif(ext is None, reason="the runtime extension is not built")
@pytest.mark.parametrize("seed", range(6))
def test_c_observe_equals_the_python_reference(seed):
    rng = random.Random(seed)
    body = [("op", rng.randrange(6)) for _ in range(rng.randrange(1, 9))]
    noise = [("noise", rng.randrange(100)) for _ in range(rng.randrange(0, 20))]
    keys = noise + body * 40                        # repeats after some ops that do not
    records = _records(keys)
    got, want = ext.Segment(), _Fields()
    for seg in (got, want):
        repeated_suffix.start(seg, 32, 512)
    assert _cuts(ext.observe_repeats, got, keys, records) == \
        _cuts(repeated_suffix.observe_py, want, keys, records)


def test_a_cut_is_whole_periods_of_at_least_min_ops():
    seg = _Fields()
    repeated_suffix.start(seg, 32, 512)
    keys = [("a",), ("b",), ("c",)] * 30
    cuts, _ = _cuts(repeated_suffix.observe_py, seg, keys, _records(keys))
    n = len(cuts) - 1
    assert cuts[-1] >= 0 and n + 1 - cuts[-1] == 33     # 11 periods of 3 ops


@pytest.mark.skipif(ext is None, reason="the runtime extension is not built")
def test_a_long_capture_calls_no_python_per_op_for_the_rule(compile_off):
    """Past ``NEURON_LAB_PERIOD_AFTER`` ops, capturing an op runs the rule in C: the capture of
    a long segment enters Python as often with the rule on (from op 16, 104 ops observed) as
    with it off, give or take a call made once (a Counter's first key)."""
    x = torch.ones(64, device="neuron")
    neuron_lab.sync()

    def body(n, c):
        y = x
        for i in range(n):
            y = y * (i + 2) - c              # int scalars are keys: nothing repeats
        return y

    def calls(after):
        seen = []

        def prof(frame, event, arg):
            if event == "call":
                seen.append(frame.f_code.co_name)
        with knobs.PERIOD_AFTER.scoped(after):
            runtime.reset()
            body(120, 3).sum().item()        # first calls: verdicts, Refs for 240 positions
            sys.setprofile(prof)
            try:
                y = body(120, 1)             # other keys: captured
            finally:
                sys.setprofile(None)
            y.sum().item()
        return seen

    on, off = calls(16), calls(10**6)
    assert "observe_py" not in on and "_cut_repeats" not in on
    assert len(on) <= len(off) + 2, (len(on), len(off))
