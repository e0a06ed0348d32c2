"""Every neuron storage has an address: the host buffer's, non-zero, unique per buffer, stable,
shared by views, so libraries that tell shared from distinct storage by ``data_ptr()`` (safetensors,
``save_pretrained``) work as on CUDA. It used to be 0 for every tensor ("The weights trying to be
saved contained shared tensors [...every weight...]")."""
import safetensors.torch as st
import torch

import neuron_lab
from neuron_lab.device import tensor_data


def test_address_is_the_host_buffers(any_mode):
    x = torch.arange(12.0).to("neuron")
    y = torch.arange(12.0).to("neuron")
    neuron_lab.sync()
    assert x.data_ptr() != 0 and x.data_ptr() != y.data_ptr()
    assert x.data_ptr() == tensor_data.host(x).data_ptr()
    assert x.untyped_storage().nbytes() == 48


def test_views_share_the_address_as_on_cpu(any_mode):
    for dev in ("cpu", "neuron"):
        x = torch.arange(12.0, device=dev).view(3, 4)
        v = x[1:, 2:]
        assert v.data_ptr() - x.data_ptr() == (4 + 2) * 4
        assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert v.untyped_storage().nbytes() == x.untyped_storage().nbytes()


def test_address_is_stable_across_in_place_ops(any_mode):
    x = torch.ones(8, device="neuron")
    p = x.data_ptr()
    x.mul_(3).add_(1)
    assert x.data_ptr() == p and x.cpu().tolist() == [4.0] * 8


def test_a_queued_value_gets_its_address_on_request():
    from neuron_lab.runtime import knobs
    neuron_lab.runtime.reset()
    with knobs.COMPILE.scoped(False), neuron_lab.mode("adaptive"):
        a = torch.ones(4, device="neuron")
        for _ in range(3):             # the region [mul, add] is learned, then deferred
            (a * 2) + 1
            neuron_lab.sync()
        y = a * 2
        assert tensor_data.is_pending(y)
        p = y.data_ptr()               # a sync point: the value (and its buffer) exists now
        assert p != 0 and not tensor_data.is_pending(y) and p == tensor_data.host(y).data_ptr()
        assert y.untyped_storage().data_ptr() == p
        assert y.cpu().tolist() == [2.0] * 4
        z = a * 2
        assert tensor_data.is_pending(z)
        assert z.untyped_storage().data_ptr() == tensor_data.host(z).data_ptr() != 0
        neuron_lab.sync()


def test_safetensors_round_trip_and_shared_detection(tmp_path):
    torch.manual_seed(0)
    w = torch.randn(4, 3)
    sd_cpu = {"a": w, "b": w, "c": torch.randn(2)}          # a, b: one storage (tied)
    sd_dev = {k: v.to("neuron") for k, v in sd_cpu.items()}
    sd_dev["b"] = sd_dev["a"]
    assert st._find_shared_tensors(sd_dev) == st._find_shared_tensors(sd_cpu) == [{"a", "b"}, {"c"}]
    del sd_dev["b"]
    st.save_file(sd_dev, tmp_path / "m.safetensors")
    back = st.load_file(tmp_path / "m.safetensors")   # (safetensors' own loader knows a fixed
    assert torch.equal(back["a"], w)                  # list of device names; load, then .to)
