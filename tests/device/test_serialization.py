"""``state_dict``, ``torch.save``/``torch.load`` with ``map_location``, in both directions.

A neuron tensor's storage holds no bytes here; saving copies to CPU (the path PyTorch takes for
storage-less backends) and loading onto ``neuron`` rebuilds device storages from the host copy.
"""
import io

import pytest
import torch
from torch import nn

N = torch.device("neuron", 0)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))


def _roundtrip(obj, **load_kw):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kw)


@pytest.mark.parametrize("where", [None, "cpu", "neuron", "neuron:0", torch.device("cpu"),
                                   {"neuron:0": "cpu"}, lambda s, loc: s])
def test_neuron_state_dict_loads_where_asked(where, any_mode):
    sd = _model().to("neuron").state_dict()
    got = _roundtrip(sd, map_location=where) if where is not None else _roundtrip(sd)
    to_cpu = where in ("cpu", torch.device("cpu")) or isinstance(where, dict) or callable(where)
    want_dev = "cpu" if to_cpu else "neuron"      # lambda s, loc: s keeps storages on CPU
    for k, v in sd.items():
        assert got[k].device.type == want_dev, k
        assert got[k].dtype == v.dtype and torch.equal(got[k].cpu(), v.cpu())


@pytest.mark.parametrize("where", ["neuron", {"cpu": "neuron"}, lambda s, loc: s.to(device="neuron")])
def test_cpu_checkpoint_loads_onto_neuron(where, any_mode):
    sd = _model().state_dict()
    got = _roundtrip(sd, map_location=where)
    for k, v in sd.items():
        assert got[k].device == N and torch.equal(got[k].cpu(), v)
    m = _model().to("neuron")
    m.load_state_dict(got)
    assert torch.equal(m[0].weight.detach().cpu(), sd["0.weight"])


def test_views_and_sharing_survive(any_mode):
    base = torch.arange(12.0, device="neuron")
    obj = {"base": base, "view": base[2:8].view(2, 3), "int": torch.tensor([1, 2], device="neuron"),
           "bf16": torch.ones(3, dtype=torch.bfloat16, device="neuron")}
    got = _roundtrip(obj, map_location="neuron")
    assert torch.equal(got["view"].cpu(), torch.arange(2.0, 8.0).view(2, 3))
    assert got["bf16"].dtype == torch.bfloat16 and got["int"].dtype == torch.int64
    got["base"].add_(1)
    assert all(t.device == N for t in got.values())


def test_requires_grad_and_parameters(any_mode):
    p = nn.Parameter(torch.randn(3, device="neuron"))
    got = _roundtrip({"p": p, "t": torch.ones(2, device="neuron", requires_grad=True)})
    assert isinstance(got["p"], nn.Parameter) and got["p"].device == N
    assert got["t"].requires_grad and got["p"].requires_grad


def test_optimizer_state_roundtrip(any_mode):
    m = _model().to("neuron")
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    m(torch.randn(5, 4, device="neuron")).sum().backward()
    opt.step()
    sd = _roundtrip(opt.state_dict(), map_location="neuron")
    opt2 = torch.optim.Adam(m.parameters(), lr=1e-2)
    opt2.load_state_dict(sd)
    s0 = opt.state[m[0].weight]
    s1 = opt2.state[m[0].weight]
    assert s1["exp_avg"].device == N and torch.equal(s1["exp_avg"].cpu(), s0["exp_avg"].cpu())


def test_file_on_disk_and_weights_only(tmp_path, any_mode):
    path = tmp_path / "ckpt.pt"
    sd = _model().to("neuron").state_dict()
    torch.save(sd, path)
    got = torch.load(path, map_location="neuron", weights_only=True)
    assert all(torch.equal(got[k].cpu(), v.cpu()) for k, v in sd.items())


def test_a_loaded_neuron_tensor_takes_in_place_ops(any_mode):
    """The host view cached on a neuron tensor's Python object was pickled with it and came back
    as a second tensor, mapped onto neuron, that kernels read: a resumed optimizer's first
    ``_foreach_lerp_`` raised 'found at least two devices, neuron:0 and cpu'."""
    got = _roundtrip({"a": torch.zeros(2, 3, device="neuron")}, map_location="neuron")["a"]
    got.lerp_(torch.ones(2, 3, device="neuron"), 0.25)
    torch._foreach_mul_([got], 2.0)
    assert got.cpu().tolist() == [[0.5] * 3] * 2
    m = _model().to("neuron")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m(torch.randn(5, 4, device="neuron")).sum().backward()
    opt.step()
    opt2 = torch.optim.AdamW(m.parameters(), lr=1e-2)
    opt2.load_state_dict(_roundtrip(opt.state_dict(), map_location="neuron"))
    opt2.step()                                    # resumed training: the first step runs


def test_deepcopy_of_a_neuron_tensor_is_independent(any_mode):
    import copy
    x = torch.arange(3.0, device="neuron")
    y = copy.deepcopy(x)
    y.add_(1)
    assert x.cpu().tolist() == [0.0, 1.0, 2.0] and y.cpu().tolist() == [1.0, 2.0, 3.0]
    assert y.data_ptr() != x.data_ptr()
