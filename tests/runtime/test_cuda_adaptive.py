"""Adaptive mode on the CUDA executor (``NEURON_LAB_EXECUTOR=cuda``): fused regions compiled by
inductor for the GPU (Triton kernels) give per-op eager's results, on a plain MLP and on a
Transformers Llama built from a config.

The executor is chosen once per process, so each check runs in a subprocess; without a GPU the
tests skip (CI has none). Tolerance as in test_training.py: fused programs may reorder float32
reductions. The policy's A/B trials are off, so every compiled region runs fused and the
fused-launch count does not depend on timing.

On an H200 (torch 2.11, one session): the MLP's forward+backward region ran fused (22 launches,
0.49 ms against 0.68 ms per-op), and AdamW's region (``_foreach_*`` ops whose floats are program
inputs) compiled but its first run raised "CUDA driver error: invalid argument", so the region
fell back to per-op (results unchanged): that case is an expected failure (strict: it reports
when it starts passing). The SGD checks and the Llama (attention on the math path, see
device/registry.py) had not yet run on a GPU when they were written.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

CHECK = textwrap.dedent("""
    import sys, torch, neuron_lab
    from torch import nn
    from neuron_lab import runtime
    from neuron_lab.device import executor, tensor_data
    from neuron_lab.runtime import knobs
    assert executor.executor_name() == "cuda"

    def mlp():
        return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))

    def llama():
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=64, tie_word_embeddings=True)
        return LlamaForCausalLM(cfg)

    make = {"mlp": mlp, "llama": llama}[sys.argv[1]]
    optimizer = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
                 "adamw": lambda ps: torch.optim.AdamW(ps, lr=3e-3)}[sys.argv[2]]

    def train(mode, steps=25):
        torch.manual_seed(0)
        model = make().to("neuron")
        opt = optimizer(model.parameters())
        g = torch.Generator().manual_seed(1)
        idx = torch.randint(0, 64, (4, 12), generator=g).to("neuron")
        x = torch.randn(64, 16, generator=g).to("neuron")
        y = torch.randint(0, 4, (64,), generator=g).to("neuron")
        losses = []
        with neuron_lab.mode(mode):
            for _ in range(steps):
                opt.zero_grad()
                if sys.argv[1] == "mlp":
                    loss = nn.functional.cross_entropy(model(x), y)
                else:
                    loss = model(input_ids=idx, labels=idx).loss
                loss.backward()
                opt.step()
                losses.append(loss.item())
        assert all(tensor_data.host(p).is_cuda for p in model.parameters())
        return torch.tensor(losses)

    eager = train("eager")
    runtime.reset()
    with knobs.TRIALS.scoped(0), knobs.SYNC_COMPILE.scoped(True):
        adaptive = train("adaptive")
    torch.testing.assert_close(adaptive, eager, rtol=1e-4, atol=1e-5)
    s = runtime.stats()
    print("fused launches", s["launches_fused"], "fused share", round(s["fused_share"], 3))
    assert s["launches_fused"] > 0, s
    assert all(r["status"] != "failed" for r in runtime.regions()), runtime.regions()
    print("ok")
""")


FOREACH_FLOATS = pytest.mark.xfail(
    strict=True, reason="H200, torch 2.11: AdamW's fused region raised 'CUDA driver error: "
                        "invalid argument' at its first run (falls back to per-op)")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA executor needs a GPU")
@pytest.mark.parametrize("model,optimizer", [
    ("mlp", "sgd"), ("llama", "sgd"),
    pytest.param("mlp", "adamw", marks=FOREACH_FLOATS),
    pytest.param("llama", "adamw", marks=FOREACH_FLOATS)])
def test_adaptive_on_the_cuda_executor_trains_like_eager(model, optimizer):
    p = subprocess.run([sys.executable, "-c", CHECK, model, optimizer], capture_output=True,
                       text=True,
                       env=dict(os.environ, NEURON_LAB_EXECUTOR="cuda"), timeout=600)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), (p.stdout[-2000:],
                                                                   p.stderr[-3000:])
