"""What each rank of the 2-process tests runs (imported by the spawned ranks, not collected).

``collectives(mode)``: every collective on ``neuron`` tensors against the same collective on CPU
tensors over a plain gloo group, bitwise. In adaptive mode each check runs three times, so from
the second time on the inputs are deferred values of a known region: the collective has to flush
them (region boundary) before gloo reads their bytes. Each check returns None or the mismatch.
"""
from __future__ import annotations

import traceback

import torch
import torch.distributed as dist

N = 6


def _inputs(rank: int, device: str, n: int = N, dtype=torch.float32):
    base = torch.arange(n, dtype=dtype, device=device)
    return (base * (rank + 1) + 0.25 * rank) * 1.5


def _same(name, got, want):
    got = [g.cpu() for g in got] if isinstance(got, (list, tuple)) else got.cpu()
    if isinstance(want, (list, tuple)):
        ok = len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    else:
        ok = torch.equal(got, want)
    return None if ok else f"{name}: neuron {got} != gloo on CPU {want}"


def _checks(rank: int, world: int, cpu_group):
    """name -> fn(device, group) returning the collective's result tensors (same code on both)."""

    def all_reduce(dev, group, op=dist.ReduceOp.SUM):
        t = _inputs(rank, dev)
        dist.all_reduce(t, op=op, group=group)
        return t

    def all_reduce_async(dev, group):
        t = _inputs(rank, dev)
        w = dist.all_reduce(t, group=group, async_op=True)
        w.wait()
        return t

    def all_gather(dev, group):
        out = [torch.empty(N, device=dev) for _ in range(world)]
        dist.all_gather(out, _inputs(rank, dev), group=group)
        return out

    def all_gather_into_tensor(dev, group):
        out = torch.empty(world * N, device=dev)
        dist.all_gather_into_tensor(out, _inputs(rank, dev), group=group)
        return out

    def reduce_scatter(dev, group):
        out = torch.empty(N, device=dev)
        dist.reduce_scatter(out, [_inputs(rank + r, dev) for r in range(world)], group=group)
        return out

    def reduce_scatter_tensor(dev, group):
        out = torch.empty(N, device=dev)
        dist.reduce_scatter_tensor(out, _inputs(rank, dev, world * N), group=group)
        return out

    def broadcast(dev, group):
        t = _inputs(rank, dev)
        dist.broadcast(t, src=1, group=group)
        return t

    def all_to_all_single(dev, group):
        out = torch.empty(world * N, device=dev)
        dist.all_to_all_single(out, _inputs(rank, dev, world * N), group=group)
        return out

    def all_to_all_single_splits(dev, group):
        ins = [2, 4] if rank == 0 else [3, 5]          # rank r sends ins[j] to rank j
        outs = [2, 3] if rank == 0 else [4, 5]
        out = torch.empty(sum(outs), device=dev)
        dist.all_to_all_single(out, _inputs(rank, dev, sum(ins)), outs, ins, group=group)
        return out

    def all_to_all(dev, group):
        outs = [torch.empty(N, device=dev) for _ in range(world)]
        dist.all_to_all(outs, [_inputs(rank + r, dev) for r in range(world)], group=group)
        return outs

    def send_recv(dev, group):
        t = _inputs(rank, dev)
        if rank == 0:
            dist.send(t, dst=1, group=group)
            dist.recv(t, src=1, group=group)
        else:
            got = torch.empty(N, device=dev)
            dist.recv(got, src=0, group=group)
            dist.send(got * 2, dst=0, group=group)
            t = got
        return t

    def isend_irecv(dev, group):
        peer = 1 - rank
        out = torch.empty(N, device=dev)
        ops = [dist.P2POp(dist.isend, _inputs(rank, dev), peer, group),
               dist.P2POp(dist.irecv, out, peer, group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return out

    def barrier(dev, group):
        t = _inputs(rank, dev)
        dist.barrier(group=group)
        return t

    return {
        "all_reduce": all_reduce,
        "all_reduce_max": lambda d, g: all_reduce(d, g, dist.ReduceOp.MAX),
        "all_reduce_async": all_reduce_async,
        "all_gather": all_gather,
        "all_gather_into_tensor": all_gather_into_tensor,
        "reduce_scatter": reduce_scatter,
        "reduce_scatter_tensor": reduce_scatter_tensor,
        "broadcast": broadcast,
        "all_to_all_single": all_to_all_single,
        "all_to_all_single_splits": all_to_all_single_splits,
        "all_to_all": all_to_all,
        "send_recv": send_recv,
        "isend_irecv": isend_irecv,
        "barrier": barrier,
    }


def collectives(rank: int, world: int) -> dict:
    """Every check in both modes: {"<mode>/<name>": None | error text}, plus telemetry."""
    import neuron_lab
    from neuron_lab.device import tracking
    from neuron_lab.runtime import knobs
    cpu_group = dist.new_group(backend="gloo")
    results = {}
    neuron_lab.clear_op_tracking()
    for mode in ("eager", "adaptive"):
        with knobs.COMPILE.scoped(False), neuron_lab.mode(mode):
            for name, fn in _checks(rank, world, cpu_group).items():
                key = f"{mode}/{name}"
                try:
                    want = fn("cpu", cpu_group)
                    err = None
                    for _ in range(3 if mode == "adaptive" else 1):
                        err = err or _same(key, fn("neuron", None), want)
                    results[key] = err
                except Exception:
                    results[key] = traceback.format_exc(limit=6)
    results["telemetry"] = {"counters": tracking.counters(), "ops": tracking.collective_ops(),
                            "flushes": dict(neuron_lab.runtime.stats()["flushes"])}
    return results
