"""Errors of deferred ops, named by the user's line that issued them.

A deferred op runs later than its line (at its region's launch); when it raises there, the
exception gets a note naming the op, its place in the launch and the user's line (the record's
``where``), and keeps its type and message. A tensor whose producer failed so never gets a made-up
value: reading it raises ``no_value``, which repeats the failure.
"""
from __future__ import annotations

from ..device import tracking


def explain(e: Exception, n: int, where: str) -> str | None:
    """Add the failing deferred op and the user's line that issued it to ``e`` (a note), for a
    launch of ``n`` ops described by ``where``; the error's text to remember, or None when
    ``e`` did not come from a deferred op (``neuron_lab_failed``: replay/fused set it)."""
    failed = getattr(e, "neuron_lab_failed", None)
    if failed is None:
        return None
    i, rec = failed
    loc, src = tracking.format_location(rec.where)
    note = (f"neuron_lab: raised by {rec.facts.name} on neuron:0, op {i + 1} of {n} in {where}"
            f" that the adaptive runtime deferred; issued at {loc}"
            + (f": {src}" if src else "") + ". It ran at this later point; "
            "neuron_lab.set_mode('eager') raises at the op's own line.")
    e.add_note(note)
    return f"{type(e).__name__}: {e} ({note})"


def no_value(s, last_error: str | None) -> RuntimeError:
    """The error for reading pending tensor ``s`` whose producer failed when its region ran."""
    return RuntimeError(
        f"neuron: this tensor (shape {tuple(s.shape)}, {s.dtype}) on neuron:0 has no "
        f"value: the deferred op that computes it failed when its region ran "
        f"({last_error or 'see the earlier error'}). Recompute it.")
