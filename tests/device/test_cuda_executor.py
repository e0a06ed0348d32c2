"""The CUDA executor (``NEURON_LAB_EXECUTOR=cuda``): same device semantics, data on the GPU.

The executor is chosen once per process, so each check runs in a subprocess. Without a GPU the
tests skip, and asking for the CUDA executor fails with a clear message (also tested).
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

CHECK = textwrap.dedent("""
    import torch, neuron_lab
    from neuron_lab.device import executor, tensor_data
    assert executor.executor_name() == "cuda"
    torch.manual_seed(0)
    c = torch.randn(64, 32)
    n = c.to("neuron")
    assert n.device == torch.device("neuron", 0) and tensor_data.host(n).is_cuda
    assert torch.allclose((n @ n.t()).cpu(), (c.cuda() @ c.cuda().t()).cpu())
    assert torch.neuron.memory_allocated() == 64 * 32 * 4      # n; the product was freed
    w = torch.randn(32, 8, device="neuron", requires_grad=True)
    (n @ w).relu().sum().backward()
    assert w.grad.device.type == "neuron" and tensor_data.host(w.grad).is_cuda
    torch.manual_seed(3); a = torch.randn(5, device="neuron")
    torch.manual_seed(3); b = torch.randn(5, device="cuda")
    assert torch.equal(a.cpu(), b.cpu())                 # RNG: the GPU's generator
    x = torch.ones(3, device="neuron", dtype=torch.float64).sum()
    assert neuron_lab.fallback_ops() and x.item() == 3.0  # same dtype rules
    torch.neuron.synchronize()
    # the direct eager kernel is the CPU executor's: here every op has its Python kernel
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::mul.Tensor", "PrivateUse1")
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::mul.Tensor", "PrivateUse2")
    print("ok")
""")


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, NEURON_LAB_MODE="eager", **env), timeout=300)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA executor needs a GPU")
def test_cuda_executor_keeps_device_semantics():
    p = _run(CHECK, NEURON_LAB_EXECUTOR="cuda")
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


TRAIN = textwrap.dedent("""
    import sys, torch
    from torch import nn
    dev, out = sys.argv[1], sys.argv[2]
    if dev == "neuron":
        import neuron_lab  # noqa: F401  (autoloaded where the package is installed)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x, y = torch.randn(4, 8).to(dev), torch.randint(0, 2, (4,)).to(dev)
    for _ in range(5):
        opt.zero_grad(); nn.functional.cross_entropy(m(x), y).backward(); opt.step()
    torch.save([p.detach().cpu() for p in m.parameters()], out)
""")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA executor needs a GPU")
def test_cuda_executor_trains_like_cuda(tmp_path):
    """The CUDA reference trains in a process without neuron_lab: once a PrivateUse1 backend is
    registered, PyTorch takes it for the process's accelerator and a backward over CUDA
    tensors fails in its autograd engine (pytorch/pytorch#161129; docs/device-contract.md)."""
    ref, got = tmp_path / "cuda.pt", tmp_path / "neuron.pt"
    for dev, out, env in (("cuda", ref, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
                          ("neuron", got, {"NEURON_LAB_EXECUTOR": "cuda"})):
        p = subprocess.run([sys.executable, "-c", TRAIN, dev, str(out)], capture_output=True,
                           text=True, env=dict(os.environ, NEURON_LAB_MODE="eager", **env),
                           timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
    assert all(torch.equal(a, b) for a, b in zip(torch.load(ref), torch.load(got)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_asking_for_cuda_without_a_gpu_is_a_clear_error():
    p = _run("import torch, neuron_lab; torch.ones(1, device='neuron')", NEURON_LAB_EXECUTOR="cuda")
    assert p.returncode != 0 and "torch.cuda.is_available() is False" in p.stderr


def test_sdpa_takes_the_math_path_on_a_host_executor_other_than_the_cpu(monkeypatch, eager):
    """CPU's fused attention kernel has no CUDA implementation: on the CUDA executor
    ``scaled_dot_product_attention`` runs the math decomposition (seen failing on an H200:
    "_scaled_dot_product_flash_attention_for_cpu has no kernel"). Checked here on the CPU
    with registry's view of the host executor swapped; the results equal CPU's math path."""
    import types

    import neuron_lab
    from neuron_lab.device import registry
    monkeypatch.setattr(registry, "executor",
                        types.SimpleNamespace(host_device=lambda: torch.device("cuda", 0)))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=g) for _ in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(
        q.to("neuron"), k.to("neuron"), v.to("neuron"), is_causal=True)
    ref = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, is_causal=True)[0]
    assert torch.equal(out.cpu(), ref)
    assert not any("flash_attention_for_cpu" in op for op in neuron_lab.executed_ops())
