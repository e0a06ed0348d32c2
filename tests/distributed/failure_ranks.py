"""What each rank runs in the bad-input tests: each function provokes one failure and returns
what the rank saw ({"error": text, "seconds": how long until it was raised} or {"ok": ...})."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def _catch(fn):
    t0 = time.perf_counter()
    try:
        fn()
        return {"ok": time.perf_counter() - t0}
    except Exception as e:                   # noqa: BLE001  (what the user would see)
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.perf_counter() - t0}


def mismatched_shapes(rank: int, world: int):
    """Rank 0 all-reduces 4 floats, rank 1 five."""
    t = torch.ones(4 + rank, device="neuron")
    return _catch(lambda: dist.all_reduce(t))


def timeout(rank: int, world: int):
    """Rank 1 never joins the all-reduce (it waits on a barrier the others never reach... it just
    sleeps past the group's timeout); rank 0 must fail after the timeout, not hang."""
    if rank == 1:
        time.sleep(6)
        return {"ok": "slept"}
    t = torch.ones(4, device="neuron")
    out = _catch(lambda: dist.all_reduce(t))
    out["value"] = t.cpu().tolist()
    return out


def timeout_async(rank: int, world: int):
    """As ``timeout``, with ``async_op=True``: the error must come out of ``work.wait()``."""
    if rank == 1:
        time.sleep(6)
        return {"ok": "slept"}
    t = torch.ones(4, device="neuron")
    return _catch(lambda: dist.all_reduce(t, async_op=True).wait())
