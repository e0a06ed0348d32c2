"""What each rank of the 2-process training tests runs (imported by the spawned ranks).

Each function trains or computes with one of PyTorch's parallel APIs on ``neuron`` in the mode
it is given, and compares with the single-process run on CPU that the API promises to equal:
DDP and FSDP2 on half the batch per rank == one process on the full batch; a DTensor sharded
matmul == the dense one; tensor parallel MLP == the plain MLP; a distributed checkpoint saved
from one model loads into another. Each returns ``{name: None | mismatch text}``.
"""
from __future__ import annotations

import copy
import traceback

import torch
import torch.distributed as dist
from torch import nn

STEPS = 3


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def _data(steps: int = STEPS, batch: int = 8):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 8, generator=g), torch.randn(batch, 4, generator=g))
            for _ in range(steps)]


def _reference(model: nn.Module, data, lr: float = 0.05) -> dict:
    """Single process, full batch, CPU: the parameters every rank must end with."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in data:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _compare(got: dict, want: dict, rtol=1e-5, atol=1e-6):
    bad = [k for k in want if not torch.allclose(got[k].cpu().float(), want[k].cpu().float(),
                                                 rtol=rtol, atol=atol)]
    if bad:
        k = bad[0]
        return f"{bad} differ; {k}: max |diff| {(got[k].cpu().float() - want[k].cpu().float()).abs().max():.3g}"
    return None


def _guard(results: dict, name: str, fn) -> None:
    try:
        results[name] = fn()
    except Exception:
        results[name] = traceback.format_exc(limit=8)


def ddp(rank: int, world: int, mode: str):
    """DDP: bucketed all-reduce (small buckets: several per step), then ``no_sync`` gradient
    accumulation over two micro-batches."""
    import neuron_lab
    from torch.nn.parallel import DistributedDataParallel as DDP
    results = {}
    data = _data()
    want = _reference(_mlp(), data)
    half = [(x.chunk(world)[rank], y.chunk(world)[rank]) for x, y in data]

    def plain():
        model = DDP(_mlp().to("neuron"), bucket_cap_mb=0.0005)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for x, y in half:
            opt.zero_grad()
            nn.functional.mse_loss(model(x.to("neuron")), y.to("neuron")).backward()
            opt.step()
        return _compare(model.module.state_dict(), want)

    def no_sync():
        model = DDP(_mlp().to("neuron"))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for x, y in half:
            opt.zero_grad()
            xs, ys = x.to("neuron").chunk(2), y.to("neuron").chunk(2)
            with model.no_sync():     # first micro-batch: local gradients only
                (nn.functional.mse_loss(model(xs[0]), ys[0]) / 2).backward()
            (nn.functional.mse_loss(model(xs[1]), ys[1]) / 2).backward()
            opt.step()
        return _compare(model.module.state_dict(), want)

    with neuron_lab.mode(mode):
        _guard(results, f"{mode}/ddp", plain)
        _guard(results, f"{mode}/ddp_no_sync", no_sync)
    return results


def fsdp2(rank: int, world: int, mode: str):
    """FSDP2 ``fully_shard`` on each Linear and the root: parameters sharded across ranks
    (all-gather before use, reduce-scatter of gradients); in float32 and with a
    ``MixedPrecisionPolicy`` (bfloat16 compute, float32 reduction and master weights)."""
    import neuron_lab
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    results = {}
    data = _data()
    half = [(x.chunk(world)[rank], y.chunk(world)[rank]) for x, y in data]

    def train(mp, want, rtol, atol):
        model = _mlp().to("neuron")
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for x, y in half:
            opt.zero_grad()
            nn.functional.mse_loss(model(x.to("neuron")), y.to("neuron")).backward()
            opt.step()
        sharded = next(iter(model.parameters()))
        if sharded.to_local().shape[0] * world != sharded.shape[0]:
            return f"parameters are not sharded: {sharded.to_local().shape} of {sharded.shape}"
        full = {k: v.full_tensor() for k, v in model.state_dict().items()}
        return _compare(full, want, rtol, atol)

    want = _reference(_mlp(), data)
    with neuron_lab.mode(mode):
        _guard(results, f"{mode}/fsdp2", lambda: train(MixedPrecisionPolicy(), want, 1e-5, 1e-6))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        # the reference in bf16 compute: what mixed precision promises, not float32's numbers
        _guard(results, f"{mode}/fsdp2_bf16", lambda: train(mp, want, 0.05, 0.02))
    return results


def dtensor(rank: int, world: int, mode: str):
    """DTensor on ``init_device_mesh("neuron", (world,))``: a row-sharded matrix times a
    replicated one equals the dense product; redistribute (all-gather) round trip."""
    import neuron_lab
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    results = {}
    mesh = init_device_mesh("neuron", (world,))
    torch.manual_seed(3)
    a, b = torch.randn(8, 6), torch.randn(6, 5)

    def matmul():
        if mesh.device_type != "neuron":
            return f"mesh on {mesh.device_type}"
        da = distribute_tensor(a.to("neuron"), mesh, [Shard(0)])
        db = distribute_tensor(b.to("neuron"), mesh, [Replicate()])
        out = da @ db
        if out.placements != (Shard(0),) or out.to_local().device.type != "neuron":
            return f"placements {out.placements} on {out.to_local().device}"
        got = out.full_tensor().cpu()
        return None if torch.allclose(got, a @ b, rtol=1e-5, atol=1e-6) else \
            f"sharded matmul != dense: {(got - a @ b).abs().max():.3g}"

    def redistribute():
        d = distribute_tensor(a.to("neuron"), mesh, [Shard(1)]).redistribute(mesh, [Replicate()])
        return None if torch.equal(d.to_local().cpu(), a) else "Shard(1) -> Replicate changed values"

    with neuron_lab.mode(mode):
        _guard(results, f"{mode}/dtensor_matmul", matmul)
        _guard(results, f"{mode}/dtensor_redistribute", redistribute)
    return results


class _FFN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.up, self.down = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def tensor_parallel(rank: int, world: int, mode: str):
    """Megatron-style tensor parallel: ``parallelize_module`` with ColwiseParallel on the up
    projection and RowwiseParallel on the down one; forward, backward and SGD steps equal the
    plain module's on CPU."""
    import neuron_lab
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    results = {}
    mesh = init_device_mesh("neuron", (world,))
    data = _data()

    def run():
        ref = _FFN()
        want = _reference(ref, [(x, y.repeat(1, 2)) for x, y in data])
        tp = parallelize_module(_FFN().to("neuron"), mesh,
                                {"up": ColwiseParallel(), "down": RowwiseParallel()})
        opt = torch.optim.SGD(tp.parameters(), lr=0.05)
        for x, y in data:                       # every rank sees the full batch under TP
            opt.zero_grad()
            nn.functional.mse_loss(tp(x.to("neuron")), y.repeat(1, 2).to("neuron")).backward()
            opt.step()
        full = {k: v.full_tensor() for k, v in tp.state_dict().items()}
        return _compare(full, want)

    with neuron_lab.mode(mode):
        _guard(results, f"{mode}/tensor_parallel", run)
    return results


def checkpoint(rank: int, world: int, mode: str, path: str):
    """``torch.distributed.checkpoint`` save of an FSDP2-sharded model and its optimizer, load
    into a freshly initialised one: every (full) tensor equal."""
    import neuron_lab
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard
    results = {}

    def build(seed):
        m = _mlp(seed).to("neuron")
        fully_shard(m)
        return m, torch.optim.Adam(m.parameters(), lr=0.01)

    def run():
        model, opt = build(0)
        x, y = _data(1)[0]
        nn.functional.mse_loss(model(x.to("neuron")), y.to("neuron")).backward()
        opt.step()
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=f"{path}/{mode}")
        other, other_opt = build(7)
        msd2, osd2 = get_state_dict(other, other_opt)
        state = {"model": msd2, "optim": osd2}
        dcp.load(state, checkpoint_id=f"{path}/{mode}")
        set_state_dict(other, other_opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        a = {k: v.full_tensor() for k, v in model.state_dict().items()}
        b = {k: v.full_tensor() for k, v in other.state_dict().items()}
        bad = _compare(b, a, 0, 0)
        if bad:
            return bad
        sa = get_state_dict(model, opt)[1]["state"]
        sb = get_state_dict(other, other_opt)[1]["state"]
        for k in sa:
            for name in ("exp_avg", "exp_avg_sq"):
                if not torch.equal(sa[k][name].full_tensor().cpu(), sb[k][name].full_tensor().cpu()):
                    return f"optimizer state {k}.{name} differs after load"
        return None

    with neuron_lab.mode(mode):
        _guard(results, f"{mode}/checkpoint", run)
    return results


def run_all(rank: int, world: int, path: str):
    """Every parallel API in both modes: one 2-process job for the whole module."""
    from neuron_lab.runtime import knobs
    results = {}
    for mode in ("eager", "adaptive"):
        with knobs.COMPILE.scoped(False):
            results |= ddp(rank, world, mode)
            results |= fsdp2(rank, world, mode)
            results |= dtensor(rank, world, mode)
            results |= tensor_parallel(rank, world, mode)
            results |= checkpoint(rank, world, mode, path)
    return results
