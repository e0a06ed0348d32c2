"""Modelled Trainium2 time per iteration, eager vs adaptive: ``neuron_lab.estimate`` on the
benchmark's own iterations (a model, not a measurement: roofline + assumed launch overhead,
``neuron_lab.cost_model("trn2")``).

For each workload that has a neuron iteration here (W1's 64-op chain with ``.item()``, W2's
20-op chain on 16 MiB, W3's MLP train step), ``estimate`` runs ``ITERS`` iterations in eager
and in adaptive mode (the first adaptive iteration records its regions, the later ones launch
them) and the result is divided by ``ITERS``. Host seconds come from the same counted run (so
compare them between modes only); the benchmark's timed metrics are the host numbers to quote.
"""
from __future__ import annotations

import torch

ITERS = 4


def _iterations():
    from . import micro, models

    def w1():
        x = torch.randn(micro.W1_N, generator=torch.Generator().manual_seed(0)).to("neuron")
        return lambda: micro.tiny_chain(x).item()

    def w2():
        x = torch.randn(micro.W2_N, generator=torch.Generator().manual_seed(0)).to("neuron")

        def it():
            micro.elementwise_chain(x)
            import neuron_lab
            neuron_lab.sync()
        return it

    def w3():
        torch.manual_seed(0)
        model = models.mlp().to("neuron")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **models.OPTIMIZER)
        x, y = models.mlp_batch("neuron")
        return lambda: models.train_step(model, opt, x, y).item()

    return {"W1": w1, "W2": w2, "W3": w3}


def run(keys, log=lambda s: None) -> dict:
    """{workload: {"eager": {...}, "adaptive": {...}, "speedup"}} per iteration on trn2."""
    import neuron_lab
    out = {}
    for k, make in _iterations().items():
        if k not in keys:
            continue
        it = make()

        def loop():
            for _ in range(ITERS):
                it()
        r = neuron_lab.estimate(loop, chip="trn2")
        row = {}
        for mode in ("eager", "adaptive"):
            m = r[mode]
            row[mode] = {"launches": m["launches"] / ITERS, "modelled_s": m["modelled_s"] / ITERS,
                         "host_s": m["host_s"] / ITERS, "bytes": m["bytes"] / ITERS,
                         "flops": m["flops"] / ITERS}
        row["speedup"] = r["speedup"]
        out[k] = row
        log(f"{k}: modelled trn2 eager {row['eager']['modelled_s'] * 1e6:.1f} us/iter, "
            f"adaptive {row['adaptive']['modelled_s'] * 1e6:.1f} us/iter")
    return out


def table(modelled: dict) -> str:
    if not modelled:
        return ""
    lines = ["Modelled Trainium2 time per iteration (a model: roofline + assumed 15 us/launch; "
             "neuron_lab.cost_model('trn2'))", "",
             "| workload | eager launches | eager trn2 µs | adaptive launches | adaptive trn2 µs "
             "| modelled eager/adaptive |", "|---|---|---|---|---|---|"]
    for k, r in modelled.items():
        e, a = r["eager"], r["adaptive"]
        sp = f"{r['speedup']:.2f}×" if r["speedup"] else "—"
        lines.append(f"| {k} | {e['launches']:.0f} | {e['modelled_s'] * 1e6:.1f} | "
                     f"{a['launches']:.0f} | {a['modelled_s'] * 1e6:.1f} | {sp} |")
    return "\n".join(lines)
