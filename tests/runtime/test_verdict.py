"""``runtime.verdict``: one decision per op call — queue, draw now, copy scalars or boundary,
with the reason — for the calls real code makes, and the engine acting on it."""
import pytest
import torch

from neuron_lab import runtime
from neuron_lab.device.op_facts import facts
from neuron_lab.runtime import verdict
from neuron_lab.runtime.producers import Producers
from neuron_lab.runtime.verdict import Kind

aten = torch.ops.aten


@pytest.fixture
def x():
    return torch.randn(4, 4).to("neuron")


def _v(op, *args, **kwargs):
    f = facts(op)
    v = verdict.call(f, args, kwargs)
    if v.kind is Kind.QUEUE:
        try:
            runtime.current().engine.describe(f, args, kwargs, 0, Producers())
        except Exception:       # record.NotQueueable: a host argument
            return verdict.host_args(f, args, kwargs)
    return v


def test_plain_ops_queue(x):
    assert _v(aten.add.Tensor, x, x) is verdict.QUEUED
    assert _v(aten.index.Tensor, x, [torch.tensor([0, 2]).to("neuron")]).kind is Kind.QUEUE
    assert _v(aten._to_copy.default, x, dtype=torch.bfloat16).kind is Kind.QUEUE
    assert verdict.plain(facts(aten.add.Tensor)) and not verdict.plain(facts(aten._to_copy.default))


def test_random_draws_now_where_it_reads_no_queued_value(x):
    v = _v(aten.native_dropout.default, x, 0.1, True)
    assert (v.kind, v.reason) == (Kind.DRAW_NOW, "dropout")
    v = _v(aten.randn.default, [3, 3], device=torch.device("neuron"))
    assert (v.kind, v.reason) == (Kind.DRAW_NOW, "random-factory") and v.call is not None
    v = _v(aten.normal_.default, x)                 # writes a tensor a queued op may read
    assert (v.kind, v.reason) == (Kind.BOUNDARY, "rng")
    q = x.view(1, 1, 4, 4)
    assert _v(aten._scaled_dot_product_flash_attention_for_cpu.default, q, q, q,
              dropout_p=0.0).kind is Kind.QUEUE    # no draw at dropout_p 0


def test_boundaries_name_their_reason(x):
    assert _v(aten._local_scalar_dense.default, x.sum()) == (Kind.BOUNDARY, "item", None)
    assert _v(aten.nonzero.default, x).reason == "data-dependent"
    mask = (torch.arange(4) > 1).to("neuron")
    assert _v(aten.index.Tensor, x, [mask]) == (Kind.BOUNDARY, "data-dependent", None)
    assert _v(aten._to_copy.default, x, device=torch.device("cpu")).reason == "cpu"


def test_host_arguments(x):
    v = _v(aten.mul.Tensor, x, torch.tensor(2.0))
    assert v.kind is Kind.COPY_SCALARS and v.call[0][1].device.type == "neuron"
    assert _v(aten.mul.Tensor, x, torch.ones(4)) == (Kind.BOUNDARY, "host-arg", None)
    assert _v(aten.copy_.default, x, torch.ones(4, 4)).reason == "transfer"


def test_the_engine_acts_on_the_verdict(compile_off, x):
    """A DRAW_NOW and a COPY_SCALARS call do not cut the segment; a BOUNDARY does, under its
    reason; values equal CPU's."""
    xc = x.cpu()
    runtime.sync()
    before = dict(runtime.stats()["flushes"])
    y = (x * torch.tensor(3.0)) + torch.randn(4, 4, generator=None, device="neuron") * 0
    z = (y + 1).sum()
    flushes = runtime.stats()["flushes"]
    assert flushes == before                          # nothing cut so far
    assert runtime.stats()["queue_depth"] >= 4
    assert abs(z.item() - ((xc * 3) + 1).sum().item()) < 1e-4
    assert runtime.stats()["flushes"].get("item", 0) == before.get("item", 0) + 1
