"""``metrics()`` (a JSON-safe snapshot) and ``metrics_report()`` (text, like torch_xla's)."""
from __future__ import annotations

from .. import distributed, runtime
from ..compile import outcomes as compile_outcomes
from ..device import executor, memory, tracking
from .store import store


def memory_now() -> dict:
    with store.lock:
        timeline = [[round(s["t"] - store.t0, 3), s["allocated"]] for s in store.memory]
    return {"allocated": memory.memory_allocated(), "reserved": memory.memory_reserved(),
            "peak": memory.max_memory_allocated(), "capacity": memory.capacity(),
            "timeline": timeline}


def metrics() -> dict:
    """Everything the views show, as plain JSON types."""
    with store.lock:
        cells = list(store.cells)
        compiles = list(store.compiles)[-20:]
        launches = len(store.launches)
        fallback_events = list(store.fallback_events)[-50:]
    return {"device": "neuron:0", "executor": executor.executor_name(),
            "mode": runtime.get_mode(), "counters": tracking.counters(),
            "executed_ops": tracking.executed_ops(), "runtime": runtime.stats(),
            "regions": runtime.regions(), "memory": memory_now(),
            "fallbacks": tracking.fallback_ops(), "cells": cells,
            "compiles": compiles, "launch_records": launches,
            "fallback_events": fallback_events, "sites": store.sites(),
            "torch_compile": compile_outcomes.snapshot(), "distributed": distributed.summary()}


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def metrics_report() -> str:
    m = metrics()
    c, r, mem = m["counters"], m["runtime"], m["memory"]
    d = m["distributed"]
    lines = [f"neuron_lab metrics (device neuron:0 on {m['executor']}, mode {m['mode']}"
             + (f", rank {d['rank']} of {d['world_size']})" if d["world_size"] > 1 else ")"),
             f"Metric: Ops\n  TotalOps: {c['ops']}\n  DistinctOps: {c['distinct_ops']}",
             f"Metric: Launches\n  PerOp: {r['launches_per_op']}\n  Fused: {r['launches_fused']}"
             f"\n  FusedShareOfOps: {r['fused_share']:.1%}",
             f"Metric: RegionCache\n  Regions: {r['regions']}\n  Hits: {r['hits']}\n"
             f"  Misses: {r['misses']}\n  HitRate: {r['hit_rate']:.1%}\n  Evictions: {r['evictions']}",
             f"Metric: Compiles\n  Queued: {r['compiles_queued']}\n  Done: {r['compiles_done']}\n"
             f"  Failed: {r['compiles_failed']}\n  Slower: {r['compiles_slower']}\n"
             f"  Pending: {r['compiles_pending']}\n  Seconds: {r['compile_seconds']:.2f}",
             "Metric: SyncPoints\n" + "".join(f"  {k}: {v}\n" for k, v in sorted(c["syncs"].items()))
             + f"  Total: {c['sync_total']}",
             f"Metric: Transfers\n  HostToDevice: {_fmt_bytes(c['h2d_bytes'])} ({c['h2d_count']})\n"
             f"  DeviceToHost: {_fmt_bytes(c['d2h_bytes'])} ({c['d2h_count']})",
             f"Metric: Memory\n  Allocated: {_fmt_bytes(mem['allocated'])}\n"
             f"  Peak: {_fmt_bytes(mem['peak'])}\n  Reserved: {_fmt_bytes(mem['reserved'])}\n"
             f"  Capacity: {_fmt_bytes(mem['capacity'])}"]
    fb = m["fallbacks"]
    lines.append("Fallbacks:" + ("".join(
        f"\n  {f['op']} x{f['count']}: {f['reason']} at {', '.join(f['locations'][:3])}"
        for f in fb) if fb else " none"))
    syncs = m["sites"]["syncs"][:5]
    lines.append("Sync points by line:" + ("".join(
        f"\n  {r['reason']} x{r['count']} at {r['location']}" for r in syncs) if syncs else " none"))
    tc = m["torch_compile"]
    lines.append(f"Metric: TorchCompile\n  Frames: {tc['frames']}\n  Recompiles: {tc['recompiles']}\n"
                 f"  Programs: {tc['programs']}\n  GraphBreaks: {tc['graph_breaks']}\n"
                 f"  Failures: {tc['failures']}\n  Seconds: {tc['dynamo_compile_seconds']:.2f}"
                 + "".join(f"\n  recompile of {r['function']} at {r['location']}: {r['failed_guard']}"
                           for r in tc["recent_recompiles"][-3:])
                 + "".join(f"\n  graph break x{b['count']} at {b['location']}: {b['reason']}"
                           for b in tc["graph_break_sites"][:3])
                 + "".join(f"\n  compile failure at {f['location']}: {f['error']} (ran {f['fallback']})"
                           for f in tc["recent_failures"][-3:]))
    if d["world_size"] > 1 or d["collectives"]:
        lines.append(f"Metric: Distributed\n  Rank: {d['rank']}\n  WorldSize: {d['world_size']}\n"
                     f"  Backend: {d['backend']}\n  Collectives: {d['collectives']}\n"
                     f"  Bytes: {_fmt_bytes(d['collective_bytes'])}\n  Seconds: {d['collective_s']:.3f}"
                     + "".join(f"\n  {k}: {v}" for k, v in sorted(d["ops"].items())))
    top = sorted(m["executed_ops"].items(), key=lambda kv: -kv[1])[:10]
    lines.append("Top ops:" + "".join(f"\n  {k}: {v}" for k, v in top))
    return "\n".join(lines)
