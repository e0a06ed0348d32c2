"""The device's hooks as the adaptive runtime fills them keep the device's contract.

``tensor_data.host(t)`` must give the host value of any neuron tensor, also one the runtime has
deferred (a pending output): the device layer calls it for transfers, ``torch.load`` and SDPA-
style helpers, and PyTorch's own C++ shallow copies reach it through ``_recover``.
"""
import pytest
import torch

import neuron_lab
from neuron_lab.device import tensor_data
from neuron_lab.runtime import knobs


@pytest.fixture
def deferred():
    """A pending ``x * 2``: the runtime has learned the region [mul, add] and defers its mul."""
    neuron_lab.runtime.reset()
    with knobs.COMPILE.scoped(False), neuron_lab.mode("adaptive"):
        x = torch.arange(8.0, device="neuron")
        for _ in range(3):
            (x * 2) + 1
            neuron_lab.sync()
        y = x * 2
        yield y
        neuron_lab.sync()


def test_the_runtime_defers_here(deferred):
    assert tensor_data.is_pending(deferred)


def test_host_materializes_a_pending_tensor(deferred):
    h = tensor_data.host(deferred)
    assert torch.equal(h.cpu(), torch.arange(8.0) * 2)


def test_reads_of_a_pending_tensor(deferred):
    assert deferred.tolist() == (torch.arange(8.0) * 2).tolist()
