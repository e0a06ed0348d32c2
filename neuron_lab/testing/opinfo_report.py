"""The OpInfo sweep's markdown report (``docs/opinfo.md``): rates per mode, then every failure,
note and skip. One report may hold several modes (``--mode both``): eager first, the reference."""
from __future__ import annotations

from collections import Counter

import torch

from .opinfo import COLUMNS, rates

EXACT = {"eager": "bitwise (rtol=atol=0)", "adaptive": "assert_close with float32 defaults"}


def _pct(r: dict) -> str:
    return f"{r['pass']}/{r['total']} ({r['rate']:.1%})"


def summary(results: list[dict], mode: str, seconds: float) -> str:
    r = rates(results)
    return (f"OpInfo sweep, {mode} mode: {r['entries']} entries, forward {_pct(r['forward'])}, "
            f"backward {_pct(r['backward'])}, in-place {_pct(r['inplace'])}, "
            f"skipped {r['skipped']}; {seconds:.0f} s")


def _cell(s: str) -> str:
    return s.replace("|", "/").replace("\n", " ")


def _rates_table(by_mode: dict) -> list[str]:
    modes = list(by_mode)
    lines = ["| column | " + " | ".join(f"{m}: pass / run" for m in modes) + " | target |",
             "|---|" + "---|" * len(modes) + "---|"]
    for col, label, target in (("forward", "forward", "≥ 95 %"),
                               ("backward", "backward (autograd entries)", "≥ 90 %"),
                               ("inplace", "in-place variant", "")):
        cells = []
        for m in modes:
            r = rates(by_mode[m])[col]
            cells.append(f"{r['pass']} / {r['total']} ({r['rate']:.1%})")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {target} |")
    lines.append("| skipped (not counted) | " +
                 " | ".join(str(rates(by_mode[m])["skipped"]) for m in modes) + " | |")
    return lines


def _mode_sections(mode: str, results: list[dict]) -> list[str]:
    lines = ["", f"## Failures, {mode} mode ({EXACT.get(mode, '')})", ""]
    failed = [x for x in results if "fail" in (x[c] for c in COLUMNS)]
    if failed:
        lines += ["| entry | forward | backward | in-place | reason |", "|---|---|---|---|---|"]
        lines += [f"| {x['name']} | {x['forward']} | {x['backward']} | {x['inplace']} | "
                  f"{_cell(x['reason'])} |" for x in failed]
    else:
        lines.append("None.")
    noted = [x for x in results if x.get("notes")]
    if noted:
        lines += ["", f"Passed with a note ({mode}):", ""]
        lines += [f"- {x['name']}: {'; '.join(x['notes'])}" for x in noted]
    return lines


def markdown(by_mode: dict, seconds: float, full: bool = True, dtype: str = "float32") -> str:
    """``by_mode``: {mode: results}; the first mode's results give the fallbacks and skips."""
    first = next(iter(by_mode.values()))
    samples = sum(x["samples"] for x in first)
    moved = sum(x["moved"] for x in first)
    lines = [
        f"# OpInfo sweep: {'every op_db entry' if full else 'a subset of op_db'}, {dtype}", "",
        f"torch {torch.__version__}; {len(first)} op_db entries, {samples} samples per mode; "
        f"modes: {', '.join(f'{m} (compared {EXACT.get(m, m)})' for m in by_mode)}; "
        f"{seconds:.0f} s in all.", ""]
    lines += _rates_table(by_mode)
    lines += [
        "", "An entry passes a column when all its samples agree with CPU: output values, dtypes "
        "and shapes, strides, which input an output aliases, outputs on the right device; "
        "gradients against a fixed random cotangent; for the in-place variant, that it returns "
        "its input and the input's new value. Samples are generated on `neuron` with the same "
        f"seed as on CPU; {moved} of {samples} were moved from CPU instead (a sample function "
        "that draws differently per device; see `neuron_lab/testing/samples.py`). Where a CPU "
        "kernel is not deterministic run to run, the comparison uses `assert_close` and says so.",
        "", "## How to run", "", "```bash",
        "python -m neuron_lab.testing.opinfo --full --mode both --report docs/opinfo.md "
        "--json reports/opinfo.json",
        "python -m neuron_lab.testing.opinfo --full --mode adaptive -v   # one line per entry",
        "python -m neuron_lab.testing.opinfo --ops add,nn.functional.conv2d -v   # a few entries",
        "pytest -m slow tests/device/test_opinfo.py                      # full sweep as a test",
        "```", "",
        "`pytest tests/device` runs the representative subset "
        "(`neuron_lab.testing.opinfo.SUBSET`) in both modes."]
    for mode, results in by_mode.items():
        lines += _mode_sections(mode, results)
    fb = Counter(op for x in first for op in x.get("fallbacks", ()))
    if fb:
        lines += ["", f"## Host fallbacks while running {dtype} samples", "",
                  "Not failures (the results agree): what falls back to the host, and why. "
                  "Mostly samples that ask for float64/complex outputs (`dtype=` kwargs).", ""]
        lines += [f"- `{op}` ({n} entries)" for op, n in sorted(fb.items(), key=lambda t: -t[1])]
    lines += ["", "## Skipped (not counted)", ""]
    by: dict[str, list] = {}
    for x in first:
        if x["forward"] == "skip":
            by.setdefault(x["reason"], []).append(x["name"])
    for why, names in sorted(by.items(), key=lambda t: -len(t[1])):
        lines.append(f"- {why} ({len(names)}): {', '.join(names)}")
    return "\n".join(lines) + "\n"
