"""Packed sequences keep ``batch_sizes``/lengths on the CPU on every device (PyTorch requires
it: "batch_sizes should always be on CPU"); ``pack_padded_sequence`` on neuron input raised a
device mismatch on the CPU lengths, then PackedSequence refused neuron batch sizes."""
import pytest
import torch
from torch import nn

import neuron_lab  # noqa: F401


def test_pack_and_pad_as_on_cuda(any_mode):
    x = torch.randn(3, 5, 2)
    lengths = torch.tensor([5, 3, 2])
    ref = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
    p = nn.utils.rnn.pack_padded_sequence(x.to("neuron").requires_grad_(), lengths,
                                          batch_first=True)
    assert p.data.device.type == "neuron" and p.batch_sizes.is_cpu
    assert torch.equal(p.data.cpu(), ref.data) and torch.equal(p.batch_sizes, ref.batch_sizes)
    padded, lens = nn.utils.rnn.pad_packed_sequence(p, batch_first=True)
    assert padded.device.type == "neuron" and lens.is_cpu and lens.tolist() == [5, 3, 2]
    padded.sum().backward()                          # _pack_padded_sequence_backward


def test_an_op_only_accelerators_have_is_a_clear_error_not_a_wrong_number():
    x = torch.ones(4, device="neuron")
    with pytest.raises(NotImplementedError,
                       match="_fused_dropout has no kernel on device neuron:0.*module.cpu"):
        torch.ops.aten._fused_dropout(x, 0.5)
