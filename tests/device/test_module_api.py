"""``torch.neuron`` has the ``torch.cuda`` names that apply; ``torch.accelerator`` code runs on it."""
import importlib

import pytest
import torch

import neuron_lab

N = torch.device("neuron", 0)


def test_registration_is_idempotent_and_named():
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    neuron_lab.device.register()
    importlib.reload(neuron_lab)
    assert torch.neuron is neuron_lab.device.module
    assert torch.device("neuron").type == "neuron" and str(N) == "neuron:0"
    assert torch.ones(1, device="neuron").is_neuron               # generated property
    assert torch.ones(1).neuron().device == N                      # generated method


def test_device_management():
    m = torch.neuron
    assert m.is_available() and m.is_initialized() and m.device_count() == 1
    assert m.current_device() == 0
    m.set_device(0)
    m.set_device("neuron:0")
    with m.device(0):
        assert torch.ones(1, device="neuron").device == N
    assert "Trainium" in m.get_device_name()
    props = m.get_device_properties(0)
    assert props.total_memory == m.mem_get_info()[1]
    m.synchronize()
    m.synchronize(0)


def test_device_properties_follow_the_modelled_hbm():
    from neuron_lab.device import config
    m = torch.neuron
    props = m.get_device_properties("neuron:0")
    assert props.name == m.get_device_name(0) == m.get_device_name()
    assert "Trainium2" in props.name and props.is_emulated
    assert (props.major, props.minor) == m.get_device_capability() == (3, 0)
    assert props.multi_processor_count == 8 and props.total_memory == m.mem_get_info()[1]
    with config.HBM_GB.scoped(2.0):
        assert m.get_device_properties().total_memory == m.mem_get_info()[1] == 2 << 30
        assert torch.accelerator.get_memory_info()[1] == 2 << 30
    assert "total_memory=" in repr(props)
    caps = torch.accelerator.get_device_capability()
    assert torch.bfloat16 in caps["supported_dtypes"]
    assert torch.float64 not in caps["supported_dtypes"]
    with pytest.raises(RuntimeError, match="1 neuron device"):
        m.get_device_properties(1)
    with pytest.raises(RuntimeError, match="expected a neuron device"):
        m.get_device_name("cpu")


def test_accelerator_api():
    acc = torch.accelerator
    assert acc.is_available() and acc.current_accelerator() == torch.device("neuron")
    assert acc.device_count() == 1 and acc.current_device_index() == 0
    acc.set_device_index(0)
    acc.synchronize()
    x = torch.ones(256, device=acc.current_accelerator())
    assert acc.memory.memory_allocated() == torch.neuron.memory_allocated() > 0
    assert acc.memory.max_memory_allocated() >= acc.memory.memory_allocated()
    assert acc.memory.memory_reserved() == torch.neuron.memory_reserved()
    assert acc.memory.memory_stats()["allocated_bytes.all.current"] == \
        torch.neuron.memory_allocated()
    acc.memory.reset_peak_memory_stats()
    acc.memory.empty_cache()
    del x


def test_amp_dtypes_and_autocast_state():
    assert torch.neuron.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    assert torch.amp.is_autocast_available("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("neuron")
        assert torch.get_autocast_dtype("neuron") == torch.bfloat16
    assert not torch.is_autocast_enabled("neuron")


def test_rng_state_get_set_and_seeds():
    m = torch.neuron
    m.manual_seed(5)
    m.manual_seed_all(5)
    state = m.get_rng_state()
    assert isinstance(state, torch.Tensor) and state.dtype == torch.uint8
    a = torch.randn(8, device="neuron")
    m.set_rng_state(state)
    assert torch.equal(torch.randn(8, device="neuron").cpu(), a.cpu())
    torch.manual_seed(123)
    assert m.initial_seed() == 123
    g = torch.Generator().manual_seed(9)
    b = torch.randn(4, generator=g, device="cpu")
    assert torch.equal(torch.randn(4, generator=torch.Generator().manual_seed(9)), b)


@pytest.mark.parametrize("bad", ["neuron:3", torch.device("neuron", 1), 2])
def test_bad_device_index_is_clear(bad):
    with pytest.raises(RuntimeError, match=r"neuron:0"):
        if isinstance(bad, int):
            torch.neuron.set_device(bad)
        else:
            torch.ones(2, device=bad)
    with pytest.raises(RuntimeError, match="1 neuron device"):
        torch.ones(2).to("neuron:3")
