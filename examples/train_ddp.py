"""Data-parallel training on neuron with PyTorch's DDP, launched by torchrun.

    torchrun --nproc-per-node 2 examples/train_ddp.py
    NEURON_LAB_MODE=adaptive torchrun --nproc-per-node 2 examples/train_ddp.py
    torchrun --nproc-per-node 2 -m neuron_lab run --json ddp.json examples/train_ddp.py

The script is PyTorch's DDP tutorial with ``device = "neuron"``: ``init_process_group()`` picks
the ``neuron`` collective backend (neuron is the accelerator), each rank trains on its shard of
every batch (``DistributedSampler``), DDP averages the gradients. ``--check`` also trains the
same model in one process on CPU on the full batches and compares the final parameters.
"""
import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import neuron_lab  # noqa: F401  (registers the neuron device and its collective backend)


def model_and_data(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 16, generator=g)
    y = x.sum(1, keepdim=True).sin() + 0.1 * torch.randn(512, 1, generator=g)
    return model, TensorDataset(x, y)


def train(model, loader, device, epochs, lr):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss = None
    for epoch in range(epochs):
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
    return loss


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=64, help="global batch size")
    p.add_argument("--check", action="store_true",
                   help="compare with one CPU process on the full batches")
    args = p.parse_args()

    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    model, data = model_and_data()
    ddp = DDP(model.to("neuron"))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(data, batch_size=args.batch // world, sampler=sampler, pin_memory=True)
    loss = train(ddp, loader, "neuron", args.epochs, lr=0.05)
    # this rank's last loss, then the mean over ranks (the full batch's loss)
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    print(f"rank {rank}/{world}: last loss {loss.item():.6f}, mean over ranks "
          f"{mean.item() / world:.6f} (backend {dist.get_backend_config()}, mode {neuron_lab.get_mode()})",
          flush=True)
    if args.check and rank == 0:
        ref, _ = model_and_data()
        train(ref, DataLoader(data, batch_size=args.batch, shuffle=False), "cpu", args.epochs,
              lr=0.05)
        diff = max((a.detach().cpu() - b.detach()).abs().max().item()
                   for a, b in zip(ddp.module.parameters(), ref.parameters()))
        print(f"max |parameter difference| vs one CPU process on the full batch: {diff:.3g}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
