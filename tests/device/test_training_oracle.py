"""Training on neuron equals training on CPU: an MLP and a small conv net (with BatchNorm), 20
steps, every optimizer path (foreach default, ``foreach=False``, fused), same seed.

Compared bitwise: losses of every step, parameters and buffers (BatchNorm running stats). The
host executor runs the same kernels in the same order, in eager mode and in adaptive mode's
per-op replays (compiling off here; fused programs and their tolerance are tests/runtime's).
"""
import subprocess
import sys

import pytest
import torch
from torch import nn


def _mlp():
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))


def _convnet():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))


def _train(make, x, y, device, opt_cls, steps=20, **opt_kw):
    torch.manual_seed(0)
    model = make().to(device)
    opt = opt_cls(model.parameters(), lr=1e-2, **opt_kw)
    xs, ys = x.to(device), y.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xs), ys)
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
    state = [t.detach().cpu() for t in model.state_dict().values()]    # params + buffers
    return torch.stack(losses), state


DATA = {"mlp": (_mlp, torch.randn(16, 10, generator=torch.Generator().manual_seed(1)),
                torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(2))),
        "conv": (_convnet, torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(3)),
                 torch.randint(0, 3, (8,), generator=torch.Generator().manual_seed(4)))}


OPTIMIZERS = [(torch.optim.SGD, {"momentum": 0.9}),
              (torch.optim.SGD, {"momentum": 0.9, "foreach": False}),
              (torch.optim.SGD, {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}),
              (torch.optim.Adam, {}), (torch.optim.Adam, {"foreach": False}),
              (torch.optim.Adam, {"fused": True}), (torch.optim.AdamW, {}),
              (torch.optim.AdamW, {"foreach": False}), (torch.optim.AdamW, {"amsgrad": True})]


@pytest.mark.parametrize("net", ["mlp", "conv"])
@pytest.mark.parametrize("opt,kw", OPTIMIZERS,
                         ids=[o.__name__ + "-" + ("-".join(f"{k}={v}" for k, v in kw.items())
                                                  or "default") for o, kw in OPTIMIZERS])
def test_training_bitwise_equal_to_cpu(net, opt, kw, any_mode):
    make, x, y = DATA[net]
    lc, pc = _train(make, x, y, "cpu", opt, **kw)
    ln, pn = _train(make, x, y, "neuron", opt, **kw)
    assert torch.equal(lc, ln)
    assert len(pc) == len(pn) and all(torch.equal(a, b) for a, b in zip(pc, pn))


def test_seed_reproducible_across_processes():
    code = ("import torch, neuron_lab; torch.manual_seed(11); "
            "print(torch.randn(4, device='neuron').tolist())")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]                       # concurrently: each pays torch's import
    runs = [p.communicate(timeout=120)[0] for p in procs]
    assert runs[0] == runs[1] and runs[0].startswith("[")
    torch.manual_seed(11)
    assert eval(runs[0]) == torch.randn(4).tolist()
    state = torch.neuron.get_rng_state()
    a = torch.randn(3, device="neuron")
    torch.neuron.set_rng_state(state)
    assert torch.equal(a.cpu(), torch.randn(3, device="neuron").cpu())
