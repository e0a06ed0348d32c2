"""Storage semantics the distributed stack relies on: a view shares its base's storage (c10d
finds in-flight collectives by storage; ``_is_alias_of``), and ``untyped_storage().resize_``
frees and re-allocates a storage's bytes in place (FSDP2 does it to every unsharded parameter),
with memory accounting and the capacity check."""
import pytest
import torch

import neuron_lab
from neuron_lab.device import memory


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
def test_views_share_their_base_storage(mode):
    with neuron_lab.mode(mode):
        x = torch.ones(4, 6, device="neuron") * 2
        views = {"view": x.view(-1), "slice": x[1:], "t": x.t(), "diagonal": x.diagonal(),
                 "as_strided": x.as_strided((2,), (1,)), "unflatten": x.view(2, 2, 6)}
        for name, v in views.items():
            assert torch._C._is_alias_of(v, x), name
            assert v.untyped_storage()._cdata == x.untyped_storage()._cdata, name
        x[1:].add_(1)
        assert views["view"].cpu().sum().item() == 2 * 24 + 18


def test_storage_resize_frees_and_reallocates_in_place():
    neuron_lab.sync()
    base = memory.memory_allocated()
    x = torch.arange(8.0, device="neuron")
    v = x[2:]
    st = x.untyped_storage()
    st.resize_(0)
    assert st.nbytes() == 0 and memory.memory_allocated() == base
    st.resize_(32)
    assert st.nbytes() == 32 and memory.memory_allocated() == base + 32
    x.copy_(torch.full((8,), 3.0))                 # views written through the base see it
    assert v.cpu().tolist() == [3.0] * 6
    del x, v, st
    assert memory.memory_allocated() == base


def test_storage_resize_past_capacity_raises_and_keeps_the_bytes(monkeypatch):
    x = torch.arange(4.0, device="neuron")
    monkeypatch.setattr(memory, "capacity", lambda: memory.memory_allocated() + 8)
    with pytest.raises(torch.OutOfMemoryError, match="UntypedStorage.resize_"):
        x.untyped_storage().resize_(1 << 20)
    monkeypatch.undo()
    assert x.untyped_storage().nbytes() == 16 and x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_storage_resize_runs_queued_work_first():
    with neuron_lab.mode("adaptive"):
        x = torch.ones(4, device="neuron")
        y = x * 5                                  # queued; its storage has no bytes yet
        y.untyped_storage().resize_(32)            # grows in place, value kept
        assert y.cpu().tolist() == [5.0] * 4
