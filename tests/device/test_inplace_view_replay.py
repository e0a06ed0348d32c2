"""In-place view ops (``squeeze_``, ``unsqueeze_``, ``t_``, ``transpose_``) change the shape of
the tensor they are called on, also when the adaptive runtime replays a region it has learned.

Found by the adaptive OpInfo sweep (``quantile``: its decomposition ends in ``squeeze_``; the
second call of a known region gave shape [1] for []; ``vector @ matrix`` and ``F.linear`` with a
1-D input, whose kernels end in ``squeeze_``, gave [1, n] for [n] from the third call). In eager mode the device kernel restrides
the device tensor (``kernels`` → ``tensor_data.restride``); a deferred op (``runtime/adaptive.py``
``_defer``, output plan kind 0) hands back the caller's tensor unchanged, so the device tensor keeps
its old shape while the host value gets the new one.
"""
import pytest
import torch

import neuron_lab
from neuron_lab.runtime import knobs

CASES = {
    "squeeze_": lambda t: t.squeeze_(-1),
    "unsqueeze_": lambda t: t.unsqueeze_(0),
    "t_": lambda t: t.t_(),
    "transpose_": lambda t: t.transpose_(0, 1),
}


def _run(fn, dev):
    x = torch.arange(6.0).reshape(3, 2)[:, :1].to(dev) + 1     # (3, 1), fresh each time
    y = fn(x.mul_(2))
    return y, x


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("mode", ["eager", "adaptive"])
def test_inplace_view_shape_on_every_repeat(name, mode):
    neuron_lab.runtime.reset()
    ref, _ = _run(CASES[name], "cpu")
    with knobs.COMPILE.scoped(False), neuron_lab.mode(mode):
        for _ in range(4):                         # capture, then the region is replayed
            y, x = _run(CASES[name], "neuron")
            assert y is x
            assert (y.shape, y.stride()) == (ref.shape, ref.stride())
            neuron_lab.sync()
            assert (y.shape, y.stride()) == (ref.shape, ref.stride())
            assert torch.equal(y.cpu(), ref)


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
def test_vector_matrix_product_shape_in_a_loop(mode):
    neuron_lab.runtime.reset()
    w = torch.arange(12.0).reshape(4, 3)
    with knobs.COMPILE.scoped(False), neuron_lab.mode(mode):
        wd = w.to("neuron")
        for _ in range(4):
            x = torch.ones(3, device="neuron")
            assert (x @ wd.t()).shape == torch.nn.functional.linear(x, wd).shape == (4,)
            neuron_lab.sync()
