"""Autograd accumulates gradients on the device as it does in eager mode, in every pass of a step.

Autograd adds a second gradient into the first in place (``add_``) only when it holds the first's
last reference and its storage's (use count one); otherwise it makes a new tensor (``add``). So
the op a step runs depends on who else holds each gradient's storage: in eager mode nobody, or,
for a view, its base. The adaptive runtime's capture runs the eager kernel; its deferred passes
hand out pending tensors, each on a storage of its own. Both must leave every storage's use count
as eager mode does, or a step's ops change between its passes (and regions never repeat), and
gradients are accumulated out of place (a new buffer, more memory and page faults).
"""
import collections

import pytest
import torch

import neuron_lab
from neuron_lab.device import tensor_data
from neuron_lab.runtime import core, record

ACCUMULATE = ("aten::add.Tensor", "aten::add_.Tensor")


def _branches(w):
    """Three gradients of ``y`` (not views): eager adds them in place."""
    y = w * 2
    return (y.tanh() + y.sigmoid() + y.exp()).sum()


def _views(w, w2, x0):
    """Two gradients of ``h`` that are views (of mm outputs): eager adds them out of place."""
    x = (x0 * 1.0).requires_grad_()
    h = x.tanh()
    y = (h.view(32, 32) @ w).view(2, 16, 32)
    y2 = (h.view(32, 32) @ w2).view(2, 16, 32)
    return (y * y2).sum()


def _accumulations(mode: str, loss_of, params, steps: int = 4) -> list:
    """The accumulating ops each step runs on the device (``executed_ops``, however launched)."""
    per_step = []
    with neuron_lab.mode(mode):
        for _ in range(steps):
            before = collections.Counter(neuron_lab.executed_ops())
            loss_of(*params).backward()
            for p in params:
                p.grad = None
            neuron_lab.sync()
            ran = collections.Counter(neuron_lab.executed_ops()) - before
            per_step.append({op: ran[op] for op in ACCUMULATE if ran[op]})
    return per_step


# The Python reference (NEURON_LAB_NATIVE_DEFER=0) weak-references storages through their Python
# objects, so it accumulates out of place: the same values, other buffers.
needs_extension = pytest.mark.skipif(core.extension() is None,
                                     reason="the reference gives storages Python objects")


@needs_extension
@pytest.mark.parametrize("graph", ["branches", "views"])
def test_every_pass_accumulates_as_eager_does(compile_off, graph):
    torch.manual_seed(0)
    if graph == "branches":
        loss_of, params = _branches, [torch.randn(64, 64).to("neuron").requires_grad_()]
    else:
        loss_of = _views
        params = [torch.randn(32, 32).to("neuron").requires_grad_(),
                  torch.randn(32, 32).to("neuron").requires_grad_(),
                  torch.randn(2, 16, 32).to("neuron")]
    eager = _accumulations("eager", loss_of, params)
    adaptive = _accumulations("adaptive", loss_of, params)
    want = {"branches": {"aten::add.Tensor": 2, "aten::add_.Tensor": 2},
            "views": {"aten::add.Tensor": 1}}[graph]
    assert eager == [want] * 4
    assert adaptive == eager            # the capture (step 1) and the deferred passes alike


@needs_extension
def test_a_pending_storage_is_held_as_eager_holds_it(compile_off):
    """Read without a Python storage object (``record.storage_id``): making one would hold the
    storage for good."""
    x = torch.randn(8, 8).to("neuron")
    with neuron_lab.mode("adaptive"):
        for _ in range(3):
            neuron_lab.sync()
            y = x * 2.0                      # a new value
            v = y.view(64)                   # a view of it
        assert tensor_data.storage_is_pending(y) and tensor_data.storage_is_pending(v)
        assert torch._C._storage_Use_Count(record.storage_id(y)) == 1
        assert torch._C._storage_Use_Count(record.storage_id(v)) == 2   # as if its base's too
        assert tensor_data.host_storage(y) is None               # pending: no bytes yet
        neuron_lab.sync()
    assert not tensor_data.storage_is_pending(y)
    assert tensor_data.host_storage(y).data_ptr() == y.data_ptr() != 0
    assert torch.equal(v.cpu(), (x.cpu() * 2.0).view(64))


def test_storage_state_functions_name_the_op_and_device_on_bad_input():
    with pytest.raises(TypeError, match="host_storage takes tensors or storages"):
        tensor_data.host_storage(3)
    with pytest.raises(RuntimeError, match="mark_pending takes a neuron tensor or storage.*cpu"):
        tensor_data.mark_pending(torch.zeros(2))
    assert tensor_data.host_storage(torch.zeros(2), "missing") == "missing"


def test_storage_ids_name_live_storages_only():
    """A producers map holds tensor and storage entries side by side: asking a tensor's weak
    reference for a storage id gets None, as a dead reference does, never an error."""
    t = torch.zeros(3).to("neuron")
    w_storage, w_tensor = record.storage_ref(t), record.weak_ref(t)
    assert record.storage_id(w_storage) == record.storage_id(t) == t.untyped_storage()._cdata
    assert record.storage_id(w_tensor) is None
    del t
    assert record.storage_id(w_storage) is None
