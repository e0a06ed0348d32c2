"""Rendering a benchmark result: the markdown table, the JSON file, the bar-chart plot.

Everything here reads only the result dict (the JSON schema below), so a saved JSON can be
re-rendered: ``python -m neuron_lab.bench.report result.json [--plot out.png]``.

Schema ``neuron_lab.bench/1``::

    {"schema", "machine": {...}, "config": {...}, "cache": {...}, "peers": [name, ...],
     "labels": {name: label}, "seconds": total,
     "workloads": {key: {"title", "seconds", "extra": {...},
                         "metrics": {name: {"unit", "better", "log",
                                            "peers": {peer: {"median", "samples"} | {"skip"}}}},
                         "ratios": [{"label", "num", "den", "op", "target", "value", "met"}]}},
     "modelled_trn2": {key: {"eager"|"adaptive": {"launches", "modelled_s", "host_s", "bytes",
                                                  "flops"} per iteration, "speedup"}}}
"""
from __future__ import annotations

import json
import sys

_QUIET_SKIPS = ("not applicable", "neuron peers only", "not measured")


def fmt(v: float | None) -> str:
    if v is None:
        return "—"
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def table(result: dict) -> str:
    """Markdown: one row per workload metric, one column per peer; then the targets."""
    peers, labels = result["peers"], result["labels"]
    notes: list[str] = []
    lines = ["| workload | metric | " + " | ".join(labels[p] for p in peers) + " |",
             "|---|---|" + "---:|" * len(peers)]
    for key, w in result["workloads"].items():
        for name, m in w["metrics"].items():
            cells = []
            for p in peers:
                e = m["peers"].get(p, {"skip": "not run"})
                if "median" in e:
                    cells.append(fmt(e["median"]))
                elif any(q in e["skip"] for q in _QUIET_SKIPS):
                    cells.append("–")
                else:
                    if e["skip"] not in notes:
                        notes.append(e["skip"])
                    cells.append(f"skip[{notes.index(e['skip']) + 1}]")
            arrow = "↓" if m["better"] == "lower" else "↑"
            what = f"{name} ({m['unit']})" if len(w["metrics"]) > 1 else m["unit"]
            lines.append(f"| {key} | {what} {arrow} | " + " | ".join(cells) + " |")
    lines += ["", "| target | value | goal | met |", "|---|---:|---:|:---:|"]
    for w in result["workloads"].values():
        for r in w["ratios"]:
            met = "—" if r["met"] is None else ("yes" if r["met"] else "**no**")
            unit = "" if r["den"] is None else "×"
            lines.append(f"| {r['label']} | {fmt(r['value'])}{unit if r['value'] is not None else ''}"
                         f" | {r['op']} {fmt(r['target'])}{unit} | {met} |")
    if notes:
        lines += [""] + [f"[{i + 1}] {n}" for i, n in enumerate(notes)]
    return "\n".join(lines)


def header(result: dict) -> str:
    m, c = result["machine"], result["cache"]
    return (f"torch {m['torch']}, {m['cores']} cores ({m['cpu']}), {m['threads']} torch threads, "
            f"load {m['load_before']} before; inductor cache {c['state']} ({c['entries_before']} "
            f"files at start, {c['dir']}); copy bandwidth {fmt(result.get('copy_bandwidth_GBps'))} "
            f"GB/s; {'quick' if result['config']['quick'] else 'full'} run, "
            f"{result['seconds']:.0f} s")


def write_json(result: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)


def plot(result: dict, path: str) -> None:
    """One bar chart per workload metric, peers side by side (log axis where values span >10×)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peers, labels = result["peers"], result["labels"]
    colors = dict(zip(peers, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    panels = [(k, n, m) for k, w in result["workloads"].items() for n, m in w["metrics"].items()
              if any("median" in e for e in m["peers"].values())]
    cols = min(4, max(1, len(panels)))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (key, name, m) in zip(axes.flat, panels):
        vals = [m["peers"].get(p, {}).get("median") for p in peers]
        xs = range(len(peers))
        ax.bar(xs, [v or 0 for v in vals], color=[colors[p] for p in peers])
        got = [v for v in vals if v]
        if m.get("log") and got and max(got) / min(got) > 10:
            ax.set_yscale("log")
        for x, v in zip(xs, vals):
            ax.annotate(fmt(v) if v is not None else "skip", (x, v or 0), ha="center",
                        va="bottom", fontsize=7)
        ax.set_xticks(list(xs), [labels[p] for p in peers], rotation=30, ha="right", fontsize=7)
        better = "lower" if m["better"] == "lower" else "higher"
        ax.set_title(f"{key} {name}\n{m['unit']} ({better} is better)", fontsize=8)
    fig.suptitle(header(result), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="Re-render a saved benchmark JSON.")
    ap.add_argument("json")
    ap.add_argument("--plot")
    a = ap.parse_args()
    with open(a.json) as f:
        res = json.load(f)
    print(header(res) + "\n\n" + table(res))
    if a.plot:
        plot(res, a.plot)
    sys.exit(0)
