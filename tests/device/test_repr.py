"""``repr`` of a neuron tensor: CPU's text plus ``device='neuron:0'``, and one sync point.

Printing is one read of the value (DESIGN: "printing or inspecting a tensor is a fusion
boundary"), counted once as ``repr``, as torch_xla's repr copies to CPU first. PyTorch's
formatter, run on the device tensor itself, would issue a dozen ``item()`` calls, a
``masked_select`` and a copy per print, each a sync of its own.
"""
import pytest
import torch

from neuron_lab.device import tracking

SUFFIX = "device='neuron:0'"

CASES = {
    "scalar": lambda: torch.tensor(3.25),
    "vector": lambda: torch.tensor([1.0, -2.5, 1e-8]),
    "summarized": lambda: torch.arange(5000.0).reshape(50, 100) / 7,
    "bfloat16": lambda: torch.randn(3, 4, generator=torch.Generator().manual_seed(0)).bfloat16(),
    "int8": lambda: torch.arange(-3, 3, dtype=torch.int8),
    "bool": lambda: torch.tensor([True, False]),
    "inf_nan": lambda: torch.tensor([float("inf"), float("nan"), 1.5]),
    "strided_view": lambda: torch.arange(24.0).reshape(4, 6)[1:, ::2].t(),
    "empty": lambda: torch.empty(0, 3),
    "requires_grad": lambda: torch.ones(2, requires_grad=True),
}


def _contents(c: torch.Tensor) -> str:
    with torch.no_grad():
        return torch._tensor_str._tensor_str(c, len("tensor(")) if c.numel() else "[]"


@pytest.mark.parametrize("name", sorted(CASES))
def test_repr_equals_cpu_with_device(name, any_mode):
    c = CASES[name]()
    n = c.detach().to("neuron").requires_grad_(c.requires_grad)
    text, ref = repr(n), repr(c)
    assert text.startswith("tensor(" + _contents(c) + ",")
    assert SUFFIX in text and text.count("dtype=") == ref.count("dtype=")
    assert ("size=" in text) == ("size=" in ref) and ("requires_grad" in text) == c.requires_grad
    assert " ".join(text.replace(", " + SUFFIX, "").split()) == " ".join(ref.split())


def test_repr_is_one_sync(any_mode):
    n = torch.arange(5000.0, device="neuron").reshape(50, 100) * 3
    before = dict(tracking.counters()["syncs"])
    str(n)
    after = tracking.counters()["syncs"]
    assert {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)} == \
        {"repr": 1}


def test_parameter_and_grad_fn_repr(any_mode):
    p = torch.nn.Parameter(torch.ones(2, device="neuron"))
    assert repr(p) == f"Parameter containing:\ntensor([1., 1.], {SUFFIX}, requires_grad=True)"
    y = p * 2
    assert repr(y) == f"tensor([2., 2.], {SUFFIX}, grad_fn=<MulBackward0>)"


def test_repr_of_a_deferred_value():
    import neuron_lab
    from neuron_lab.runtime import knobs
    neuron_lab.runtime.reset()
    with knobs.COMPILE.scoped(False), neuron_lab.mode("adaptive"):
        x = torch.arange(6.0, device="neuron")
        for _ in range(4):                  # the region is learned, then replayed (deferred)
            y = (x * 2) + 1
            assert repr(y) == f"tensor([ 1.,  3.,  5.,  7.,  9., 11.], {SUFFIX})"


def test_fake_neuron_tensor_repr_prints_metadata():
    """torch.compile traces with fake tensors on the neuron device, and AOTAutograd formats them
    (its DEBUG structured log calls repr on every graph input): a fake tensor has no device data,
    so its repr is torch's own metadata form, not a read of device bytes (CI failure of af8c56e)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    real = torch.ones(4, 8, device="neuron")
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(real)
    text = repr(fake)
    assert "FakeTensor" in text and "size=(4, 8)" in text and "neuron:0" in text
