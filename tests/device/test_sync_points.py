"""A value leaves the device only at a sync point, and every sync point is counted by reason.

Host reads (``item``, ``tolist``, ``cpu``, ``repr``, numpy via ``.cpu()``) and ops whose output
shape depends on the data (``nonzero``, ``masked_select``, boolean indexing, ``unique``) are the
sync points; ordinary ops are not. Counted in ``tracking.counters()["syncs"]``.
"""
import pytest
import torch

import neuron_lab
from neuron_lab.device import tracking


def syncs():
    return dict(tracking.counters()["syncs"])


def delta(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


@pytest.fixture
def x(any_mode):
    t = torch.tensor([0.0, 1.0, 2.0, 1.0], device="neuron")
    neuron_lab.sync()
    return t


READS = {
    "item": (lambda t: t.sum().item(), "item"), "tolist": (lambda t: t.tolist(), None),
    "cpu": (lambda t: t.cpu(), "cpu"), "to_cpu": (lambda t: t.to("cpu"), "cpu"),
    "repr": (lambda t: repr(t), "repr"), "float": (lambda t: float(t[1]), "item"),
    "bool": (lambda t: bool(t[1] > 0), "item"),
}


@pytest.mark.parametrize("name", sorted(READS))
def test_host_reads_are_counted(x, name):
    fn, reason = READS[name]
    before = syncs()
    fn(x)
    d = delta(before, syncs())
    assert sum(d.values()) >= 1, d
    if reason:
        assert d.get(reason, 0) >= 1, d


DATA_DEPENDENT = {
    "nonzero": lambda t: t.nonzero(), "masked_select": lambda t: torch.masked_select(t, t > 0.5),
    "bool_index": lambda t: t[t > 0.5], "unique": lambda t: torch.unique(t),
    "unique_consecutive": lambda t: torch.unique_consecutive(t),
    "argwhere": lambda t: torch.argwhere(t), "repeat_interleave": lambda t: torch.repeat_interleave(
        torch.tensor([1, 2], device="neuron")),
}


@pytest.mark.parametrize("name", sorted(DATA_DEPENDENT))
def test_data_dependent_shapes_are_counted(x, name):
    c = x.cpu()
    before = syncs()
    out = DATA_DEPENDENT[name](x)
    d = delta(before, syncs())
    assert d.get("data-dependent", 0) >= 1, d
    ref = DATA_DEPENDENT[name](c) if name != "repeat_interleave" else \
        torch.repeat_interleave(torch.tensor([1, 2]))
    assert torch.equal(out.cpu(), ref)


def test_ordinary_ops_are_not_sync_points(x):
    before = syncs()
    y = ((x * 2 + 1).exp().sum(0) / 3).sqrt()
    z = torch.where(x > 1, x, -x)                        # a mask that stays on the device
    x.masked_fill(x > 1, 0.0)
    x[torch.tensor([0, 2], device="neuron")]             # integer indexing is not data-dependent
    neuron_lab.sync()
    d = delta(before, syncs())
    assert set(d) <= {"synchronize"}, d
    assert y.device.type == z.device.type == "neuron"


def test_counters_and_transfers(x):
    c = tracking.counters()
    for k in ("ops", "distinct_ops", "fallbacks", "syncs", "sync_total", "h2d_bytes", "d2h_bytes"):
        assert k in c
    before = tracking.counters()
    torch.ones(256).to("neuron")
    x.cpu()
    after = tracking.counters()
    assert after["h2d_bytes"] - before["h2d_bytes"] == 1024
    assert after["d2h_bytes"] - before["d2h_bytes"] == 16
    assert after["sync_total"] > before["sync_total"]


def test_counters_can_be_read_from_another_thread_while_fallbacks_are_recorded():
    """Telemetry snapshots ``counters()`` from its pusher thread; with the main thread adding
    fallback rows meanwhile, summing them without the lock raised "dictionary changed size
    during iteration" in the pusher (seen in CI as an error in a later test's setup)."""
    import sys
    import threading
    from neuron_lab.device import tracking

    errors, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                tracking.counters()
            except RuntimeError as e:
                errors.append(e)

    def record(i):                       # a user frame for the fallback's location
        tracking.record_fallback(f"aten::test_op_{i}", "test")

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)          # switch often: the race shows within a few hundred rows
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        for i in range(1000):
            record(i)
    finally:
        stop.set()
        t.join(10)
        sys.setswitchinterval(old)
        neuron_lab.clear_op_tracking()
    assert errors == []
