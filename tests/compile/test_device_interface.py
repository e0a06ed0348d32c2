"""Inductor knows ``neuron`` whatever a graph's inputs are (issue 43, item 1): a device
interface and a codegen registration, and every graph that touches ``neuron`` — one that only
creates ``neuron`` tensors, one with mixed CPU/``neuron`` inputs, one that moves its result to
the CPU — compiles with the default backend and with ``backend="neuron"``, results equal to
eager (integers exactly; floats rtol 1e-6)."""
import pytest
import torch

from neuron_lab.compile import outcomes


def test_device_interface_registered():
    from torch._dynamo.device_interface import get_interface_for_device
    di = get_interface_for_device("neuron")
    assert di.device_count() == 1 and di.is_available() and di.current_device() == 0
    assert di.is_dtype_supported(torch.bfloat16)
    assert not di.is_dtype_supported(torch.float64)        # Trainium has no float64
    assert di.get_device_properties().total_memory > 0
    assert isinstance(di.current_stream(), torch.Stream)
    di.synchronize()


def test_codegen_registered_for_the_device():
    torch.compile(lambda x: x + 1, backend="neuron")(torch.ones(2, device="neuron"))
    from torch._inductor.codegen.common import (get_scheduling_for_device,
                                                get_wrapper_codegen_for_device)
    assert get_scheduling_for_device("neuron") is not None
    assert get_wrapper_codegen_for_device("neuron") is not None


def _factory(n):
    return torch.arange(n, device="neuron").sum()


def _mixed(x_cpu, y):
    return x_cpu.to("neuron") * y + 1


def _to_cpu(x_cpu):
    ones = torch.ones(4, device="neuron").cumsum(0)
    return (ones * 2).cpu() + x_cpu


@pytest.mark.parametrize("backend", ["inductor", "neuron"])
def test_graphs_that_create_move_or_return_neuron_tensors(backend):
    outcomes.clear()
    f = torch.compile(_factory, backend=backend)
    out = f(8)
    assert out.device.type == "neuron" and out.item() == 28

    x, y = torch.arange(6.0), torch.linspace(0, 1, 6)
    got = torch.compile(_mixed, backend=backend)(x, y.to("neuron"))
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), x * y + 1, rtol=1e-6, atol=0)

    got = torch.compile(_to_cpu, backend=backend)(torch.ones(4))
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, torch.tensor([3.0, 5.0, 7.0, 9.0]))
    snap = outcomes.snapshot()
    assert snap["failures"] == 0, snap["recent_failures"]
    assert snap["programs"] >= 3, snap
