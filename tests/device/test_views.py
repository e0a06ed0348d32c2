"""Views alias, in-place ops write through them, and version counters move as on CPU.

Each test does the same sequence to a CPU tensor and to its neuron copy and compares every
tensor afterwards, plus the metadata (strides, offsets, ``_base``) a view exposes.
"""
import pytest
import torch


def bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t

VIEWS = {
    "t": lambda x: x.t(), "slice": lambda x: x[1:, ::2], "select": lambda x: x[2],
    "view": lambda x: x.view(-1), "reshape": lambda x: x.reshape(4, 6), "unsqueeze": lambda x: x[None],
    "expand": lambda x: x[:1].expand(3, -1, -1), "narrow": lambda x: x.narrow(1, 1, 2),
    "diagonal": lambda x: x.diagonal(), "as_strided": lambda x: x.as_strided((2, 2), (1, 3), 4),
    "unfold": lambda x: x.unfold(0, 2, 1), "permute": lambda x: x.permute(1, 0),
    "split": lambda x: x.split(2)[1], "unbind": lambda x: x.unbind(1)[3],
    "movedim": lambda x: x.movedim(0, 1), "view_dtype": lambda x: x.view(torch.int32),
    "real": lambda x: x.real, "squeeze": lambda x: x[:, :1].squeeze(1),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_metadata_and_aliasing(name, any_mode):
    c = torch.arange(24.0).reshape(6, 4).clone()   # a base, not a view
    n = c.to("neuron")
    vc, vn = VIEWS[name](c), VIEWS[name](n)
    assert vn.shape == vc.shape and vn.stride() == vc.stride()
    assert vn.storage_offset() == vc.storage_offset() and vn.dtype == vc.dtype
    assert vn._is_view() == vc._is_view() and (vn._base is n) == (vc._base is c)
    assert torch.equal(vn.cpu(), vc)
    if name != "expand":                                # writes through the view reach the base
        vc.view(-1)[0:1].fill_(-5) if vc.is_contiguous() else vc.fill_(-5)
        vn.view(-1)[0:1].fill_(-5) if vn.is_contiguous() else vn.fill_(-5)
        assert torch.equal(bits(n.cpu()), bits(c))


def test_inplace_ops_and_version_counter(any_mode):
    c = torch.arange(12.0).reshape(3, 4).clone()
    n = c.to("neuron")
    v0c, v0n = c._version, n._version
    idx = {"cpu": torch.tensor([2]), "neuron": torch.tensor([2], device="neuron")}
    for f in (lambda x: x.mul_(2), lambda x: x.add_(1, alpha=3), lambda x: x.t().sub_(0.5),
              lambda x: x[1].clamp_(0, 9), lambda x: x.index_fill_(1, idx[x.device.type], -1.0),
              lambda x: x.masked_fill_(x > 10, 0.0), lambda x: x.__setitem__((0, 0), 100.0),
              lambda x: x[:, 1:3].copy_(torch.ones(3, 2))):      # CPU source: a transfer
        f(c)
        f(n)
        assert torch.equal(n.cpu(), c)
    assert n._version - v0n == c._version - v0c > 0


def test_inplace_returns_self_and_out_kwarg(any_mode):
    n = torch.ones(4, device="neuron")
    assert n.add_(1) is n and n.t_() is n
    out = torch.empty(4, device="neuron")
    r = torch.add(n, 1, out=out)
    assert r is out and torch.equal(out.cpu(), torch.full((4,), 3.0))
    small = torch.empty(0, device="neuron")
    torch.mul(n, 2, out=small)                          # out= resizes, as on CPU
    assert small.shape == (4,) and torch.equal(small.cpu(), torch.full((4,), 4.0))


def test_aliasing_between_views(any_mode):
    c = torch.zeros(4, 4)
    n = c.to("neuron")
    rows_c, cols_c = c[1], c[:, 1]
    rows_n, cols_n = n[1], n[:, 1]
    rows_c += 1
    rows_n += 1
    cols_c.mul_(3)
    cols_n.mul_(3)
    assert torch.equal(cols_n.cpu(), cols_c) and torch.equal(n.cpu(), c)
    assert rows_n._version == n._version == cols_n._version


def test_resize_and_set(any_mode):
    n = torch.arange(4.0, device="neuron")
    n.resize_(2, 2)
    assert n.shape == (2, 2) and torch.equal(n.cpu(), torch.arange(4.0).reshape(2, 2))
    m = torch.empty(0, device="neuron")
    m.set_(n)
    assert m.shape == (2, 2)
    m[0, 0] = 9.0                                      # shares n's storage
    assert n[0, 0].item() == 9.0


def test_clone_and_contiguous_copy(any_mode):
    n = torch.arange(6.0, device="neuron").reshape(2, 3).t()
    k = n.contiguous()
    assert k.is_contiguous() and not n.is_contiguous() and torch.equal(k.cpu(), n.cpu())
    k[0, 0] = 50.0
    assert n[0, 0].item() == 0.0
    cl = n.clone()
    assert cl.stride() == n.stride()                   # preserve_format keeps dense strides
    cl.fill_(1.0)
    assert n.sum().item() == 15.0
