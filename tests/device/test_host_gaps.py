"""Ops whose host kernel lacks a dtype an accelerator computes (``device/host_gaps.py``): the
device computes them another way, exactly, instead of raising. Transformers' MoE layers call
``torch.histc`` on int tensors on any non-CPU device; CPU's kernel refuses int."""
import pytest
import torch
import torch.nn.functional as F

import neuron_lab  # noqa: F401
from neuron_lab.device import host_gaps

H = torch.float16


def _cuda_histc(x, bins, lo, hi):
    """CUDA's integer histc, written out: bin = (x - min) * bins // (max - min), max -> last."""
    counts = [0] * bins
    for v in x.reshape(-1).tolist():
        if lo <= v <= hi:
            counts[min((v - lo) * bins // (hi - lo), bins - 1)] += 1
    return torch.tensor(counts, dtype=x.dtype)


@pytest.mark.parametrize("make", [
    lambda: torch.histc(torch.tensor([1, 2]), bins=3, min=0, max=2),
    lambda: torch.abs(torch.tensor([True])),
    lambda: torch.trace(torch.ones(2, 2, dtype=torch.bool)),
    lambda: F.avg_pool3d(torch.ones(1, 1, 2, 2, 2, dtype=H), 2),
    lambda: F.multi_margin_loss(torch.ones(2, 3, dtype=torch.bfloat16), torch.tensor([0, 1])),
])
def test_each_gap_still_exists_on_the_host(make):
    # if CPU gains the kernel, the substitute should go (host_gaps' table)
    with pytest.raises(NotImplementedError, match="not implemented for"):
        make()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
@pytest.mark.parametrize("bins,lo,hi", [(8, 0, 7), (4, 0, 7), (3, 2, 5), (5, 0, 0)])
def test_int_histc_as_cuda_computes_it(any_mode, dtype, bins, lo, hi):
    x = torch.tensor([0, 1, 1, 3, 2, 7, 9, 5, 4, 6, 7], dtype=dtype)
    got = torch.histc(x.to("neuron"), bins=bins, min=lo, max=hi).cpu()
    if lo == hi:
        lo, hi = int(x.min()), int(x.max())
    assert got.dtype == dtype and torch.equal(got, _cuda_histc(x, bins, lo, hi))
    # on integer-valued data it agrees with CPU's float histc
    assert torch.equal(got.float(), torch.histc(x.float(), bins=bins, min=lo, max=hi))


def test_int_histc_out_and_bad_bounds(any_mode):
    x = torch.tensor([0, 1, 2, 2], device="neuron", dtype=torch.int32)
    out = torch.empty(0, dtype=torch.int32, device="neuron")
    torch.histc(x, bins=3, min=0, max=2, out=out)
    assert out.cpu().tolist() == [1, 1, 2]
    with pytest.raises(RuntimeError, match="max must be larger than min.*neuron"):
        torch.histc(x, bins=3, min=3, max=1).cpu()


def test_bool_abs_and_trace(any_mode):
    b = torch.tensor([[True, False], [False, True]])
    n = b.to("neuron")
    assert torch.equal(torch.abs(n).cpu(), b) and torch.abs(n).dtype == torch.bool
    assert torch.equal(n.clone().abs_().cpu(), b)
    t = torch.trace(n)
    assert t.dtype == torch.int64 and t.item() == 2
    assert torch.equal(F.softsign(n).cpu(), b / (1 + b.long()))      # softsign runs abs


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_ops_computed_in_float32_and_rounded_once(any_mode, dtype):
    torch.manual_seed(0)
    x = torch.randn(1, 2, 4, 4, 4)
    xl = x.to(dtype).requires_grad_()
    xn = x.to(dtype).to("neuron").requires_grad_()
    ref = F.avg_pool3d(xl.float(), 2)
    out = F.avg_pool3d(xn, 2)
    assert out.dtype == dtype and torch.equal(out.cpu(), ref.to(dtype))
    out.sum().backward()
    ref.sum().backward()
    assert torch.equal(xn.grad.cpu(), xl.grad.to(dtype))
    img = torch.randn(1, 3, 8, 8)
    up = F.interpolate(img.to(dtype).to("neuron"), size=(5, 5), mode="bilinear", antialias=True)
    assert torch.equal(up.cpu(), F.interpolate(img.to(dtype).float(), size=(5, 5),
                                               mode="bilinear", antialias=True).to(dtype))
    s, tgt = torch.randn(3, 4).to(dtype), torch.tensor([0, 3, 1])
    assert torch.equal(F.multi_margin_loss(s.to("neuron"), tgt.to("neuron")).cpu(),
                       F.multi_margin_loss(s.float(), tgt).to(dtype))


def test_other_dtypes_take_the_host_kernel():
    assert torch.equal(torch.histc(torch.tensor([0.5, 1.5], device="neuron"), bins=2, min=0,
                                   max=2).cpu(), torch.tensor([1.0, 1.0]))
    assert "histc" in host_gaps.covered() and "int64" in host_gaps.covered()["histc"]


def test_a_dtype_still_missing_on_the_host_is_a_clear_error():
    x = torch.randn(4, dtype=H, device="neuron")
    with pytest.raises(NotImplementedError, match="neuron: .*rrelu.*float16 on device neuron:0.*float32"):
        F.rrelu(x, training=True).cpu()


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU, torch.nn.LSTMCell, torch.nn.GRUCell])
def test_recurrent_layers_use_the_fused_cells_cuda_uses(any_mode, cls):
    """PyTorch's RNNs call _thnn_fused_lstm_cell/_thnn_fused_gru_cell (+ backward) on any
    accelerator; CPU has no kernel for them ("Could not run ... 'CPU' backend")."""
    torch.manual_seed(0)
    m = cls(3, 4) if "Cell" in cls.__name__ else cls(3, 4, num_layers=2)
    x = torch.randn(5, 2, 3) if "Cell" not in cls.__name__ else torch.randn(2, 3)

    def run(mod, inp):
        out = mod(inp)
        out = out[0] if isinstance(out, tuple) else out
        out.square().sum().backward()
        return out.detach().cpu(), [p.grad.cpu() for p in mod.parameters()]
    ref, gref = run(m, x)
    m.zero_grad()
    got, grad = run(m.to("neuron"), x.to("neuron"))
    # CUDA's gate order (matmul, then biases) vs CPU's biased matmuls: float32 rounding apart
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(grad, gref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
