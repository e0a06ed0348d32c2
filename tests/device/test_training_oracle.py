"""Real PyTorch code on neuron equals CPU: training loops, optimizers, save/load, autocast, RNG.

Eager mode is compared bitwise (the host executor runs the same kernels in the same order).
"""
import io
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import neuron_lab


@pytest.fixture(autouse=True)
def eager():
    with neuron_lab.mode("eager"):
        yield


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
    return torch.stack(losses), [p.detach().cpu() for p in model.parameters()]


DATA = {"mlp": (_mlp, torch.randn(16, 10, generator=torch.Generator().manual_seed(1)),
                torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(2))),
        "conv": (_convnet, torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(3)),
                 torch.randint(0, 3, (8,), generator=torch.Generator().manual_seed(4)))}


@pytest.mark.parametrize("net", ["mlp", "conv"])
@pytest.mark.parametrize("opt,kw", [(torch.optim.SGD, {"momentum": 0.9}),
                                    (torch.optim.Adam, {}), (torch.optim.AdamW, {}),
                                    (torch.optim.AdamW, {"foreach": False}),
                                    (torch.optim.SGD, {"momentum": 0.9, "foreach": False})])
def test_training_bitwise_equal_to_cpu(net, opt, kw):
    make, x, y = DATA[net]
    lc, pc = _train(make, x, y, "cpu", opt, **kw)
    ln, pn = _train(make, x, y, "neuron", opt, **kw)
    assert torch.equal(lc, ln)
    assert all(torch.equal(a, b) for a, b in zip(pc, pn))


def test_autograd_features():
    x = torch.randn(4, requires_grad=True, device="neuron")
    seen = []
    x.register_hook(lambda g: seen.append(g.cpu()))
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert torch.equal(x.grad.cpu(), 4 * x.detach().cpu()) and len(seen) == 2
    with torch.no_grad():
        assert not (x * 2).requires_grad
    with torch.inference_mode():
        assert (x * 2).is_inference()
    p = nn.Parameter(torch.ones(3, device="neuron"))
    p.data.mul_(3)                                   # .data: a C++ shallow copy
    assert torch.equal(p.cpu(), torch.full((3,), 3.0))


def test_save_load_both_directions():
    model = _mlp().to("neuron")
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    sd_cpu = torch.load(buf, map_location="cpu")
    assert all(v.device.type == "cpu" for v in sd_cpu.values())
    buf.seek(0)
    sd_dev = torch.load(buf)
    assert all(v.device == torch.device("neuron", 0) for v in sd_dev.values())
    cpu_model = _mlp()
    cpu_model.load_state_dict(sd_cpu)
    b2 = io.BytesIO()
    torch.save(cpu_model.state_dict(), b2)
    b2.seek(0)
    back = torch.load(b2, map_location="neuron")
    assert all(torch.equal(back[k].cpu(), v.cpu()) for k, v in model.state_dict().items())


def test_autocast_bfloat16():
    model = _mlp().to("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = model(torch.randn(2, 10, device="neuron"))
    assert out.dtype == torch.bfloat16


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


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA executor needs a GPU")
def test_cuda_executor():
    code = ("import torch, neuron_lab; from neuron_lab.device import executor; "
            "x = torch.ones(4, device='neuron') * 2; "
            "assert executor.executor_name() == 'cuda'; print(x.sum().item())")
    env = dict(os.environ, NEURON_LAB_EXECUTOR="cuda")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and p.stdout.strip() == "8.0", p.stderr
