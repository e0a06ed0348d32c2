"""``python -m neuron_lab analyze TRACE.parquet``: the advisor's findings from a trace file alone.

The file is the one ``neuron_lab.profile(out_dir)`` writes (``out_dir/trace.parquet``,
``trace_file.py``); nothing of the process that recorded it is needed, so an external tool or
an agent can run the analysis offline. The rules are ``advise.py``'s, on the ``Recording`` the
file holds; the costs are priced on the chip the file names.
"""
from __future__ import annotations

from .advise import findings
from .trace_file import read_recording


def analyze(path: str) -> list[dict]:
    """Ranked findings (``advise()``'s form) from the trace file at ``path``."""
    rec, _ = read_recording(path)
    return findings(rec)


def summary(path: str) -> str:
    """The findings as text, with what the file holds."""
    rec, launches = read_recording(path)
    found = findings(rec)
    dev = sum(r["dur_s"] or 0.0 for r in launches)
    mod = sum(r["modelled_s"] or 0.0 for r in launches)
    lines = [f"{path}: {len(launches)} device launches, {dev * 1e3:.3f} ms on the host executor, "
             f"{mod * 1e3:.3f} ms modelled on {rec.chip} (a model); "
             f"{len(found)} finding{'s' if len(found) != 1 else ''}"]
    for i, f in enumerate(found, 1):
        lines += [f"{i}. [{f['kind']}] {f['where']}  ({f['modelled_s'] * 1e3:.3f} ms on "
                  f"{rec.chip}, x{f['count']})",
                  f"   {f['message']}", f"   fix: {f['fix']}"]
    return "\n".join(lines)
