"""The OpInfo sweep's markdown report (``docs/opinfo.md``): rates, then every failure and skip."""
from __future__ import annotations

from collections import Counter

import torch

from .opinfo import COLUMNS, rates


def _pct(r: dict) -> str:
    return f"{r['pass']}/{r['total']} ({r['rate']:.1%})"


def summary(results: list[dict], mode: str, seconds: float) -> str:
    r = rates(results)
    return (f"OpInfo sweep, {mode} mode: {r['entries']} entries, forward {_pct(r['forward'])}, "
            f"backward {_pct(r['backward'])}, in-place {_pct(r['inplace'])}, "
            f"skipped {r['skipped']}; {seconds:.0f} s")


def _cell(s: str) -> str:
    return s.replace("|", "/").replace("\n", " ")


def markdown(results: list[dict], mode: str, seconds: float, full: bool = True) -> str:
    r = rates(results)
    exact = "bitwise (rtol=atol=0)" if mode == "eager" else "assert_close float32 defaults"
    samples = sum(x["samples"] for x in results)
    moved = sum(x["moved"] for x in results)
    lines = [
        f"# OpInfo sweep: {'every op_db entry' if full else 'representative subset'}, "
        f"{mode} mode, float32", "",
        f"torch {torch.__version__}; {r['entries']} op_db entries, {samples} samples run; "
        f"comparison {exact}; {seconds:.0f} s.", "",
        "| column | pass / run | rate | target |", "|---|---|---|---|",
        f"| forward | {r['forward']['pass']} / {r['forward']['total']} | "
        f"{r['forward']['rate']:.1%} | ≥ 95 % |",
        f"| backward (autograd entries) | {r['backward']['pass']} / {r['backward']['total']} | "
        f"{r['backward']['rate']:.1%} | ≥ 90 % |",
        f"| in-place variant | {r['inplace']['pass']} / {r['inplace']['total']} | "
        f"{r['inplace']['rate']:.1%} | |",
        f"| skipped (not counted) | {r['skipped']} | | |", "",
        "An entry passes a column when all its samples agree with CPU: output values, dtypes and "
        "shapes, strides, which input an output aliases, outputs on `neuron`; gradients against "
        "a fixed random cotangent; for the in-place variant, that it returns its input and the "
        f"input's new value. {moved} of {samples} samples were moved from CPU rather than "
        "generated on `neuron` (see `neuron_lab/testing/samples.py`).", "",
        "## How to run", "",
        "```bash",
        "python -m neuron_lab.testing.opinfo --full --report docs/opinfo.md --json reports/opinfo.json",
        "python -m neuron_lab.testing.opinfo --full --mode adaptive   # same, adaptive runtime",
        "python -m neuron_lab.testing.opinfo --ops add,nn.functional.conv2d -v   # a few entries",
        "pytest -m slow tests/device/test_opinfo.py                    # full sweep as a test",
        "```", "",
        "`pytest tests/device` runs the representative subset "
        "(`neuron_lab.testing.opinfo.SUBSET`) in eager and adaptive mode.", "",
        "## Failures", ""]
    failed = [x for x in results if "fail" in (x[c] for c in COLUMNS)]
    if failed:
        lines += ["| entry | forward | backward | in-place | reason |", "|---|---|---|---|---|"]
        lines += [f"| {x['name']} | {x['forward']} | {x['backward']} | {x['inplace']} | "
                  f"{_cell(x['reason'])} |" for x in failed]
    else:
        lines.append("None.")
    noted = [x for x in results if x.get("notes")]
    if noted:
        lines += ["", "## Passed with a note", ""]
        lines += [f"- {x['name']}: {'; '.join(x['notes'])}" for x in noted]
    fb = Counter(op for x in results for op in x.get("fallbacks", ()))
    if fb:
        lines += ["", "## Host fallbacks recorded while running float32 samples", "",
                  "Not failures (results agree); the ops a float32 program would fall back on:", ""]
        lines += [f"- `{op}` ({n} entries)" for op, n in sorted(fb.items(), key=lambda t: -t[1])]
    lines += ["", "## Skipped (not counted)", ""]
    by = {}
    for x in results:
        if x["forward"] == "skip":
            by.setdefault(x["reason"], []).append(x["name"])
    for why, names in sorted(by.items(), key=lambda t: -len(t[1])):
        lines.append(f"- {why} ({len(names)}): {', '.join(names)}")
    return "\n".join(lines) + "\n"
