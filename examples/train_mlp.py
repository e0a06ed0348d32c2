"""A plain training script: `python -m neuron_lab run examples/train_mlp.py --steps 50`."""
import argparse

import torch

import neuron_lab  # noqa: F401  (registers the neuron device)

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=50)
p.add_argument("--fail", action="store_true", help="exit with code 3 (tests the exit code)")
args = p.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
model.to("neuron")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
x, y = torch.randn(256, 32).to("neuron"), torch.randn(256, 1).to("neuron")
for step in range(args.steps):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step:3d} loss {loss.item():.4f}")
if args.fail:
    raise SystemExit(3)
