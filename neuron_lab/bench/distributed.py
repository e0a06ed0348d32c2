"""D1: data-parallel training and all-reduce bandwidth with 2 ranks on loopback.

``python -m neuron_lab.bench --distributed [--quick]`` starts one 2-process job with PyTorch's
own launcher (``elastic_launch``, what torchrun runs; ``spawn``) and measures, in it:

- **DDP step time** of the MLP from W3 (batch 64 split over the ranks, AdamW), for three peers
  interleaved sample by sample: gloo on CPU tensors (the reference: the same transport without
  the emulated device), DDP on ``neuron`` in eager mode, and in adaptive mode. Each sample is
  ``inner`` steps ending with a host read of the loss; the median over samples is reported,
  ranks agree on the sample boundaries (a barrier before each).
- **All-reduce bus bandwidth** for 4 MiB float32 (nccl-tests' definition: bytes × 2(n−1)/n per
  second), neuron vs gloo on CPU tensors, medians.

Both ranks share the machine's cores, so this measures the backend's overhead over gloo, not a
network. The ratios (neuron / gloo) are what the issue asks for; absolute numbers depend on the
load (recorded).
"""
from __future__ import annotations

import os
import statistics
import time
import uuid

INNER = 5


def _rank(quick: bool) -> dict:
    import datetime

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import neuron_lab
    from neuron_lab import runtime
    from neuron_lab.runtime import knobs

    dist.init_process_group(timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    torch.set_num_threads(1)
    samples = 5 if quick else 15

    def mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                   torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                   torch.nn.Linear(512, 10))

    def ddp_step_fn(device, group):
        model = DDP(mlp().to(device), process_group=group)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)   # as every peer's
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(64 // world, 256, generator=g).to(device)
        y = torch.randint(0, 10, (64 // world,), generator=g).to(device)

        def run():
            loss = None
            for _ in range(INNER):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
            return loss.item()
        return run

    def timed(fn):
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    peers = {}
    with knobs.COMPILE.scoped(True):
        peers["gloo (CPU tensors)"] = ("eager", ddp_step_fn("cpu", gloo))
        with neuron_lab.mode("eager"):
            peers["neuron eager"] = ("eager", ddp_step_fn("neuron", None))
        with neuron_lab.mode("adaptive"):
            peers["neuron adaptive"] = ("adaptive", ddp_step_fn("neuron", None))
        for name, (mode, fn) in peers.items():          # warm-up: caches, regions, compiles
            with neuron_lab.mode(mode):
                for _ in range(3 if quick else 6):
                    fn()
                runtime.wait_compiles(60)
        step = {name: [] for name in peers}
        for _ in range(samples):                         # interleaved
            for name, (mode, fn) in peers.items():
                with neuron_lab.mode(mode):
                    step[name].append(timed(fn) / INNER)

    n = 1 << 20                                          # 4 MiB of float32
    bufs = {"gloo (CPU tensors)": (torch.ones(n), gloo), "neuron": (torch.ones(n, device="neuron"), None)}
    bw = {name: [] for name in bufs}
    with neuron_lab.mode("eager"):
        for name, (t, group) in bufs.items():
            dist.all_reduce(t, group=group)
        for _ in range(samples):
            for name, (t, group) in bufs.items():
                s = timed(lambda: dist.all_reduce(t, group=group))
                bw[name].append(4 * n * 2 * (world - 1) / world / s / 1e9)
    dist.destroy_process_group()
    return {"ddp_step_ms": {k: [v * 1e3 for v in xs] for k, xs in step.items()},
            "allreduce_busbw_GBps": bw}


def run(quick: bool, log=print) -> dict:
    """Start the 2-rank job; return rank 0's samples with medians and ratios."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    cfg = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=uuid.uuid4().hex,
                       rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                       monitor_interval=0.2, start_method="spawn")
    log("D1: DDP step and all-reduce bandwidth, 2 ranks on loopback")
    t0 = time.perf_counter()
    load = os.getloadavg()[0]
    samples = elastic_launch(cfg, _rank)(quick)[0]
    out = {"load_before": round(load, 2), "seconds": round(time.perf_counter() - t0, 1),
           "inner_steps": INNER}
    for metric, peers in samples.items():
        out[metric] = {k: {"median": statistics.median(v), "samples": v} for k, v in peers.items()}
    ref = "gloo (CPU tensors)"
    step = out["ddp_step_ms"]
    out["ratios"] = {f"{k} / {ref} (step time)": step[k]["median"] / step[ref]["median"]
                     for k in step if k != ref}
    bw = out["allreduce_busbw_GBps"]
    out["ratios"][f"neuron / {ref} (all-reduce bus bandwidth)"] = \
        bw["neuron"]["median"] / bw[ref]["median"]
    return out


def table(d: dict) -> str:
    lines = ["| D1: 2 ranks on loopback | median |", "|---|--:|"]
    for k, v in d["ddp_step_ms"].items():
        lines.append(f"| DDP MLP step, {k} (ms) | {v['median']:.2f} |")
    for k, v in d["allreduce_busbw_GBps"].items():
        lines.append(f"| all-reduce 4 MiB bus bandwidth, {k} (GB/s) | {v['median']:.2f} |")
    for k, v in d["ratios"].items():
        lines.append(f"| {k} | {v:.2f}× |")
    return "\n".join(lines)
