"""Tied weights survive moves: ``_has_compatible_shallow_copy_type`` holds between CPU and
neuron, so ``Module._apply`` swaps each Parameter's data (``param.data = moved``) instead of
making a new Parameter per module (which untied every embedding/head pair: GPT-2's 16 parameters
became 17 and training diverged from CPU at step 2)."""
import copy

import torch
from torch.nn.utils import parametrize

import neuron_lab  # noqa: F401


def _tied():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(16, 8)
    head = torch.nn.Linear(8, 16, bias=False)
    head.weight = emb.weight
    return torch.nn.ModuleList([emb, head])


def test_shallow_copy_compatibility_as_for_cuda():
    c, n = torch.ones(2), torch.ones(2, device="neuron")
    assert torch._has_compatible_shallow_copy_type(c, n)
    assert torch._has_compatible_shallow_copy_type(n, c)
    assert torch._has_compatible_shallow_copy_type(n, n)
    assert not torch._has_compatible_shallow_copy_type(torch.ones(2, device="meta"), n)


def test_issue_repro_tie_survives_to(any_mode):
    m = _tied().to("neuron")
    assert m[0].weight is m[1].weight
    assert m[0].weight.device.type == "neuron" and type(m[0].weight) is torch.nn.Parameter
    assert len(list(m.parameters())) == 1
    m.cpu()
    assert m[0].weight is m[1].weight and m[0].weight.device.type == "cpu"


def test_tie_survives_to_empty_and_grads_move_with_params(any_mode):
    m = _tied()
    m[0].weight.grad = torch.ones_like(m[0].weight)
    m.to("neuron")
    assert m[0].weight.grad.device.type == "neuron"
    assert torch.equal(m[0].weight.grad.cpu(), torch.ones(16, 8))
    m.to_empty(device="neuron")
    assert m[0].weight is m[1].weight


def test_data_swap_refreshes_the_cached_host_view(any_mode):
    p = torch.nn.Parameter(torch.zeros(3, device="neuron"))
    p.data = torch.arange(3.0, device="neuron")      # neuron -> neuron (was an error: a bool of
    assert p.tolist() == [0.0, 1.0, 2.0]             # a 3-element tensor)
    p.data = torch.ones(3)                            # neuron -> cpu
    assert p.device.type == "cpu" and p.tolist() == [1.0, 1.0, 1.0]


def test_tied_training_matches_cpu(any_mode):
    def run(dev):
        m = _tied().to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], device=dev)
        losses = []
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(m[1](m[0](ids)).flatten(0, 1), ids.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, m[0].weight.detach().cpu()
    (lc, wc), (ln, wn) = run("cpu"), run("neuron")
    assert lc == ln and torch.equal(wc, wn)


def test_deepcopy_keeps_ties(any_mode):
    m = copy.deepcopy(_tied().to("neuron"))
    assert m[0].weight is m[1].weight and m[0].weight.device.type == "neuron"


def test_load_state_dict_assign_as_on_cpu(any_mode):
    def params_after(dev, keep_vars):
        m = _tied().to(dev)
        src = _tied().to(dev)
        m.load_state_dict(src.state_dict(keep_vars=keep_vars), assign=True)
        return len({id(p) for p in (m[0].weight, m[1].weight)}), m[0].weight.device.type
    for keep in (False, True):
        assert params_after("neuron", keep) == (params_after("cpu", keep)[0], "neuron")


def test_parametrize_on_a_tied_weight(any_mode):
    class Double(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    def run(dev):
        m = _tied().to(dev)
        parametrize.register_parametrization(m[0], "weight", Double())
        out = m[0](torch.tensor([1, 2], device=dev)).sum()
        out.backward()
        return out.item(), m[0].parametrizations.weight.original.grad.cpu()
    (oc, gc), (on, gn) = run("cpu"), run("neuron")
    assert oc == on and torch.equal(gc, gn)


def test_meta_init_then_to_empty_as_on_cpu():
    def tied_after(dev):
        with torch.device("meta"):
            m = _tied()
        m = m.to_empty(device=dev)
        return m[0].weight is m[1].weight
    # from meta PyTorch makes a new Parameter per module on every device (meta is not
    # shallow-copy compatible): the tie is for the caller to restore, as Transformers does
    assert tied_after("neuron") == tied_after("cpu")
