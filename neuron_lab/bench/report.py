"""Rendering a benchmark result: the markdown tables, the JSON file, the bar-chart plot.

Everything here reads only the result dict (the JSON schema below), so a saved JSON can be
re-rendered::

    python -m neuron_lab.bench.report docs/bench/results.json            # header + tables
    python -m neuron_lab.bench.report docs/bench/results.json --markdown # the README's block
    python -m neuron_lab.bench.report docs/bench/results.json --readme README.md  # rewrite it
    python -m neuron_lab.bench.report docs/bench/results.json --readme docs/benchmarks.md --full

``--readme`` replaces what lies between ``<!-- bench-table:begin -->`` and
``<!-- bench-table:end -->`` in the file with the ``--markdown`` block, so the README's table
and ratios come from the committed JSON only.

Schema ``neuron_lab.bench/2``: one run (one core budget)::

    {"schema", "machine": {...}, "budget": {"name", "cpus", "threads"}, "config": {...},
     "cache": {...}, "peers": [name, ...], "labels": {name: label}, "seconds": total,
     "workloads": {key: {"title", "seconds", "extra": {..., "conditions": {peer: {...}}},
                         "metrics": {name: {"unit", "better", "log",
                                            "peers": {peer: {"median", "samples"} | {"skip"}}}},
                         "ratios": [{"label", "num", "den", "op", "target", "value", "met"}]}},
     "modelled_trn2": {key: {...}}}

or several (``--budget both``): ``{"schema", "machine", "runs": [run, ...]}``. ``runs(result)``
gives the list either way.
"""
from __future__ import annotations

import json
import sys

from .canary import check as check_canary

SCHEMA = "neuron_lab.bench/2"
_QUIET_SKIPS = ("not applicable", "neuron peers only", "not measured")


def runs(result: dict) -> list[dict]:
    """The runs (one per core budget) a result holds."""
    return list(result["runs"]) if "runs" in result else [result]


def combine(rs: list[dict]) -> dict:
    """One result holding several runs; the machine is the first run's."""
    return {"schema": SCHEMA, "machine": rs[0]["machine"], "runs": rs}


def fmt(v: float | None) -> str:
    if v is None:
        return "—"
    a = abs(v)
    if a >= 99.95:
        return f"{v:,.0f}"
    if a >= 9.995:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _cell(e: dict, peer: str, labels: dict, notes: list[str]) -> str:
    """A table cell: the median, "–" (not applicable), or "fails[n]"/"skip[n]" with a note."""
    if "median" in e:
        return fmt(e["median"])
    why = e["skip"]
    if any(q in why for q in _QUIET_SKIPS):
        return "–"
    note = f"{labels.get(peer, peer)}: {why}"
    if note not in notes:
        notes.append(note)
    kind = "fails" if why.startswith("error:") else "skip"
    return f"{kind}[{notes.index(note) + 1}]"


def budget_name(run: dict) -> str:
    return (run.get("budget") or {}).get("name", "?")


# The README's short table: the metrics that carry each workload's point.
SHORT = {"W1": ("us_per_op", "cpu_us_per_op"), "W2": ("ms", "cpu_ms"),
         "W3": ("steps_per_s", "cpu_ms_per_step", "steps_per_s_sync10", "cpu_ms_per_step_sync10"),
         "W4": ("steps_per_s", "cpu_ms_per_step", "first_step_s"), "W5": ("hit_rate",),
         "W6": ("steps_per_s", "cpu_ms_per_step", "steps_per_s_sync10", "cpu_ms_per_step_sync10"),
         "W7": ("slowdown",)}


def table(result: dict, targets: bool = True, only: dict | None = None) -> str:
    """Markdown for one run: one row per workload metric, one column per peer; then the
    targets (``targets``) and the notes on peers that failed or skipped. ``only``: workload ->
    the metrics to show (others left out)."""
    peers, labels = result["peers"], result["labels"]
    notes: list[str] = []
    lines = ["| workload | metric | " + " | ".join(labels[p] for p in peers) + " |",
             "|---|---|" + "---:|" * len(peers)]
    for key, w in result["workloads"].items():
        if only is not None and key not in only:
            continue
        for name, m in w["metrics"].items():
            if only is not None and name not in only[key]:
                continue
            cells = [_cell(m["peers"].get(p, {"skip": "not run"}), p, labels, notes) for p in peers]
            arrow = "↓" if m["better"] == "lower" else "↑"
            shared = sum(o["unit"] == m["unit"] for o in w["metrics"].values()) > 1
            what = f"{name} ({m['unit']})" if shared else m["unit"]   # the unit says it, if unique
            lines.append(f"| {key} | {what} {arrow} | " + " | ".join(cells) + " |")
    if targets:
        lines += ["", "| target | value | goal | met |", "|---|---:|---:|:---:|"]
        for w in result["workloads"].values():
            for r in w["ratios"]:
                lines.append(f"| {r['label']} | {_ratio(r)} | {r['op']} {fmt(r['target'])}"
                             f"{'' if r['den'] is None else '×'} | {_met(r)} |")
    if notes:
        lines += [""] + [f"[{i + 1}] {n}" for i, n in enumerate(notes)]
    return "\n".join(lines)


def _ratio(r: dict) -> str:
    if r["value"] is None:
        return "—"
    return fmt(r["value"]) + ("" if r["den"] is None else "×")


def _met(r: dict) -> str:
    return "—" if r["met"] is None else ("yes" if r["met"] else "**no**")


def header(result: dict) -> str:
    m, c = result["machine"], result["cache"]
    b = result.get("budget") or {}
    where = (f"budget {b['name']} (CPU {','.join(map(str, b['cpus']))}, {b['threads']} torch "
             f"thread{'s' if b['threads'] != 1 else ''})" if b else f"{m['threads']} torch threads")
    canary = result.get("parallel_op_us") or {}
    out = (f"torch {m['torch']}, {m['cores']} cores ({m['cpu']}), {where}, "
           f"load {m['load_before']} before, {m.get('load_after', '?')} after; inductor cache "
           f"{c['state']} ({c['entries_before']} files at start); copy bandwidth "
           f"{fmt(result.get('copy_bandwidth_GBps'))} GB/s; "
           + (f"parallel-op canary {fmt(canary['start'])} µs at start, {fmt(canary['end'])} at "
              f"end; " if canary else "")
           + f"{'quick' if result['config']['quick'] else 'full'} run, {result['seconds']:.0f} s")
    warning = check_canary(canary.get("start"), canary.get("end"))
    return out + (f"\n\n**Warning:** {warning}." if warning else "")


def text(result: dict) -> str:
    """Header and full table of every run in ``result``."""
    return "\n\n".join(f"### {budget_name(r)}\n\n{header(r)}\n\n{table(r)}" for r in runs(result))


def ratios_table(result: dict, first: tuple[str, ...] = ("W6",),
                 keys: tuple[str, ...] | None = None) -> str:
    """The targets side by side for every run (a column per budget), ``first`` workloads first;
    ``keys``: only those workloads' targets."""
    rs = runs(result)
    only_keys = keys
    names = [budget_name(r) for r in rs]
    order: list[str] = []
    found: dict[tuple[str, str], dict] = {}
    for r in rs:
        keys = sorted(r["workloads"], key=lambda k: (k not in first, list(r["workloads"]).index(k)))
        for k in keys:
            if only_keys is not None and k not in only_keys:
                continue
            for q in r["workloads"][k]["ratios"]:
                if q["label"] not in order:
                    order.append(q["label"])
                found[(budget_name(r), q["label"])] = q
    lines = ["| ratio (goal) | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for label in order:
        any_q = next(found[(n, label)] for n in names if (n, label) in found)
        goal = f"{any_q['op']} {fmt(any_q['target'])}{'' if any_q['den'] is None else '×'}"
        cells = []
        for n in names:
            q = found.get((n, label))
            cells.append("—" if q is None else _ratio(q) + ("" if q["met"] is not False else " (no)"))
        lines.append(f"| {label} ({goal}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(result: dict, short: bool = False) -> str:
    """The README's block: the machine line, each budget's table (no targets), the ratios;
    ``short``: the metrics of ``SHORT`` and W6's ratios only (docs/benchmarks.md has all)."""
    rs = runs(result)
    m = result["machine"]
    out = [f"Measured on {m['cores']} cores ({m['cpu']}), torch {m['torch']}, load "
           f"{m['load_before']} at the start; "
           + "; ".join(f"{budget_name(r)}: {'quick' if r['config']['quick'] else 'full'} run, "
                       f"{r['seconds']:.0f} s, load {r['machine'].get('load_after', '?')} at its end"
                       for r in rs)
           + f"; AdamW {rs[0]['config'].get('optimizer', '?')} for every peer. Medians, peers "
             "interleaved; compare within a row."]
    for r in rs:
        b = r.get("budget") or {}
        out += ["", f"**{budget_name(r)}** (CPUs {','.join(map(str, b.get('cpus', [])))}, "
                    f"{b.get('threads', '?')} torch threads):", "",
                table(r, targets=False, only=SHORT if short else None)]
    out += ["", ("W6's ratios" if short else "Ratios") + " (goal in brackets; \"(no)\": goal "
            "missed)" + (", every target in docs/benchmarks.md:" if short else ":"), "",
            ratios_table(result, keys=("W6",) if short else None)]
    return "\n".join(out)


BEGIN, END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"


def update_readme(result: dict, path: str, short: bool = True) -> None:
    """Replace the block between ``BEGIN`` and ``END`` in ``path`` with ``markdown(result)``
    (``short``: the README's short table)."""
    with open(path) as f:
        s = f.read()
    if BEGIN not in s or END not in s:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} block to replace")
    a, rest = s.split(BEGIN, 1)
    _, b = rest.split(END, 1)
    with open(path, "w") as f:
        f.write(a + BEGIN + "\n" + markdown(result, short) + "\n" + END + b)


def write_json(result: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)


def plot(result: dict, path: str) -> None:
    """One bar chart per workload metric, peers side by side (log axis where values span >10×);
    the first run of a result with several."""
    result = runs(result)[0]
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


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m neuron_lab.bench.report",
                                 description="Re-render a saved benchmark JSON.")
    ap.add_argument("json")
    ap.add_argument("--markdown", action="store_true", help="print the README's block")
    ap.add_argument("--readme", metavar="README.md", help="rewrite the README's block in place")
    ap.add_argument("--full", action="store_true",
                    help="every metric and target (docs/benchmarks.md), not the README's short table")
    ap.add_argument("--plot")
    a = ap.parse_args(argv)
    with open(a.json) as f:
        res = json.load(f)
    if a.readme:
        update_readme(res, a.readme, short=not a.full)
        print(f"updated {a.readme}", file=sys.stderr)
    elif a.markdown:
        print(markdown(res, short=not a.full))
    else:
        print(text(res))
    if a.plot:
        plot(res, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
