"""A region's status changes only along ``status.NEXT`` (one table, one writer: ``Region.move``)."""
import pytest

from neuron_lab.runtime.cache import RegionCache
from neuron_lab.runtime.record import QueuedOp
from neuron_lab.runtime.status import NEXT, BadTransition, Status


def _region():
    import torch
    from neuron_lab.device.op_facts import facts
    rec = QueuedOp(facts(torch.ops.aten.add.Tensor), (), None, ("k",), [])
    return RegionCache().insert([rec])


def test_every_state_has_its_transitions_written_down():
    assert set(NEXT) == set(Status)


def test_the_compile_path():
    r = _region()
    assert r.status is Status.RECORDED and r.summary()["status"] == "recorded"
    for s in (Status.QUEUED, Status.COMPILING, Status.TRIAL, Status.FUSED):
        r.move(s)
    assert r.summary()["status"] == "fused"


def test_a_transition_not_in_the_table_raises():
    r = _region()
    with pytest.raises(BadTransition, match="recorded -> fused"):
        r.move(Status.FUSED)
    assert r.status is Status.RECORDED


def test_failing_drops_the_program_and_keeps_the_reason():
    r = _region()
    r.move(Status.QUEUED)
    r.move(Status.COMPILING)
    r.program = object()
    r.move(Status.FAILED, "compile: boom")
    assert r.program is None and r.error == "compile: boom"


def test_an_evicted_region_ignores_late_news_from_the_compile_thread():
    r = _region()
    r.move(Status.QUEUED)
    r.move(Status.COMPILING)
    r.move(Status.EVICTED)
    assert r.move(Status.TRIAL) is False and r.status is Status.EVICTED
