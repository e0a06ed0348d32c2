"""Soak: an adaptive training run for a long time, sampling memory and object counts.

``python -m neuron_lab.testing.soak --seconds 3600 --json soak.json`` trains a small MLP with
AdamW in adaptive mode (forward, backward, clip, step, a loss ``item()`` every step, an eval
pass every 20 steps) and samples, every ``--every`` seconds: device memory allocated, live
device storages, Python objects tracked by the GC, region count, process RSS, steps done.
A leak shows as growth between samples after the warm-up (the first minute: regions form and
compile). ``tests/runtime/test_soak.py`` runs it for an hour under ``-m slow`` and for a few
hundred steps by default; docs/reliability.md has the figures.
"""
from __future__ import annotations

import argparse
import gc
import json
import resource
import time

import torch
from torch import nn

import neuron_lab
from neuron_lab import runtime
from neuron_lab.device import memory


def _rss_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sample(steps: int, t0: float) -> dict:
    gc.collect()
    return {"t": round(time.perf_counter() - t0, 2), "steps": steps,
            "allocated": memory.memory_allocated(), "live_storages": memory.live_storages(),
            "gc_objects": len(gc.get_objects()), "regions": len(runtime.regions()),
            "rss_mib": round(_rss_mib(), 1)}


def run(seconds: float = 60.0, every: float = 10.0, max_steps: int | None = None,
        out: str | None = None, every_steps: int | None = None) -> list[dict]:
    """Train for ``seconds`` (or ``max_steps``); sample every ``every`` seconds, or every
    ``every_steps`` steps if given."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 10))
    with neuron_lab.mode("adaptive"):
        model = model.to("neuron")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = [(torch.randn(32, 64).to("neuron"), torch.randint(0, 10, (32,)).to("neuron"))
                for _ in range(8)]
        t0 = time.perf_counter()
        samples, steps, next_at = [sample(0, t0)], 0, every
        while time.perf_counter() - t0 < seconds and (max_steps is None or steps < max_steps):
            x, y = data[steps % len(data)]
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            loss.item()
            steps += 1
            if steps % 20 == 0:
                with torch.no_grad():
                    model(data[0][0]).argmax(-1).cpu()
            if (steps % every_steps == 0) if every_steps else time.perf_counter() - t0 >= next_at:
                samples.append(sample(steps, t0))
                next_at += every
                if out:
                    with open(out, "w") as f:
                        json.dump(samples, f)
        neuron_lab.sync()
        samples.append(sample(steps, t0))
    if out:
        with open(out, "w") as f:
            json.dump(samples, f)
    return samples


def table(samples: list[dict]) -> str:
    """The samples as a Markdown table (docs/reliability.md)."""
    cols = ("t", "steps", "allocated", "live_storages", "gc_objects", "regions", "rss_mib")
    rows = ["| " + " | ".join(cols) + " |", "|" + "--:|" * len(cols)]
    rows += ["| " + " | ".join(str(s[c]) for c in cols) + " |" for s in samples]
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3600.0)
    ap.add_argument("--every", type=float, default=60.0)
    ap.add_argument("--json")
    ap.add_argument("--table", help="print the samples of this JSON file as a Markdown table")
    a = ap.parse_args()
    if a.table:
        with open(a.table) as f:
            print(table(json.load(f)))
        return
    for s in run(a.seconds, a.every, out=a.json):
        print(json.dumps(s))


if __name__ == "__main__":
    main()
