"""What torch.compile did on ``neuron``: compiled programs, graph breaks, recompiles, fallbacks.

Three sources, one snapshot (``snapshot()``, JSON-safe, shown by ``neuron_lab.metrics()`` under
``"compile"``):

- programs: one ``ProgramRecord`` per post-grad graph our ``inner_compile`` built;
- graph breaks and compile failures: recorded as they happen (``GraphBreak``, ``CompileFailure``),
  each with the user's source line (``file.py:12`` or ``Cell In[3], line 4``);
- frames, recompiles (with the guard that failed) and compile time: read from dynamo's own
  per-frame ``CompilationMetrics`` when the snapshot is taken.

Lists are bounded (the last ``_MAX`` entries); counts are totals.
"""
from __future__ import annotations

import itertools
import re
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass

from ..device import tracking

_lock = threading.Lock()
_ids = itertools.count(1)
_MAX = 100


@dataclass(frozen=True)
class ProgramRecord:
    graph_id: int
    kind: str            # "forward" | "backward" | "inference"
    nodes: int           # ATen ops in the post-grad graph
    seconds: float       # host-graph rewrite + inductor compile (or FX-graph-cache load)
    opaque_ops: tuple    # ops inductor calls as they are (custom ops, extern kernels)


@dataclass(frozen=True)
class GraphBreak:
    location: str        # the user's line where dynamo stopped the graph
    reason: str


@dataclass(frozen=True)
class CompileFailure:
    location: str        # the user's line of the graph's first op
    error: str           # exception type and first line of its message
    fallback: str        # what ran instead


programs: deque = deque(maxlen=_MAX)
graph_breaks: deque = deque(maxlen=_MAX)
failures: deque = deque(maxlen=_MAX)
_totals = Counter()
_break_counts: Counter = Counter()
_since = [0.0]       # dynamo's frame metrics older than the last clear() are not shown


def next_graph_id() -> int:
    return next(_ids)


def record_program(gid: int, kind: str, gm, seconds: float) -> None:
    n, opaque = 0, set()
    for node in gm.graph.nodes:
        if node.op == "call_function":
            n += 1
            ns = getattr(node.target, "namespace", None)
            if ns is not None and ns not in ("aten", "prims", "higher_order"):
                opaque.add(str(node.target.name()))
    with _lock:
        programs.append(ProgramRecord(gid, kind, n, round(seconds, 4), tuple(sorted(opaque))))
        _totals["programs"] += 1
        _totals[f"programs_{kind}"] += 1
        _totals["inner_compile_seconds"] += seconds


def _location(filename: str | None, lineno: int | None) -> str:
    if filename is None:
        return "<unknown>:0"
    return tracking.format_location((filename, lineno or 0))[0]


def record_graph_break(filename: str | None, lineno: int | None, reason: str) -> None:
    first = reason.strip().splitlines()[0] if reason.strip() else "graph break"
    loc = _location(filename, lineno)
    with _lock:
        graph_breaks.append(GraphBreak(loc, first))
        _break_counts[(loc, first)] += 1
        _totals["graph_breaks"] += 1


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def graph_location(gm) -> str:
    """The user's line of the first op of dynamo graph ``gm`` (from its nodes' stack traces)."""
    for node in gm.graph.nodes:
        st = node.meta.get("stack_trace")
        if st:
            frames = _FRAME.findall(st)
            if frames:
                fn, line = frames[-1]
                return _location(fn, int(line))
    return "<unknown>:0"


def record_failure(gm, exc: BaseException, fallback: str) -> CompileFailure:
    msg = str(exc).strip().splitlines()
    rec = CompileFailure(graph_location(gm), f"{type(exc).__name__}: {msg[0] if msg else ''}"[:500],
                         fallback)
    with _lock:
        failures.append(rec)
        _totals["failures"] += 1
    return rec


def _dynamo_frames() -> dict:
    """Frames compiled, recompiles with their failed guard, and compile time, from dynamo."""
    if "torch._dynamo.utils" not in sys.modules:
        return {"frames": 0, "recompiles": 0, "recent_recompiles": [], "dynamo_compile_seconds": 0.0}
    # An import statement, not the sys.modules entry: a background region compile may be
    # importing dynamo right now, and its half-initialized module lacks get_compilation_metrics
    # (metrics() raised AttributeError); the import waits for the other thread's to finish.
    import torch._dynamo.utils as utils
    metrics = [m for m in utils.get_compilation_metrics() if (m.start_time or 0.0) >= _since[0]]
    recompiles = [m for m in metrics if m.recompile_reason]
    return {
        "frames": len(metrics),
        "recompiles": len(recompiles),
        "recent_recompiles": [
            {"location": _location(m.co_filename, m.co_firstlineno), "function": m.co_name,
             "failed_guard": m.recompile_reason.strip().splitlines()[0]} for m in recompiles[-20:]],
        "dynamo_compile_seconds": round(sum(m.entire_frame_compile_time_s or 0.0 for m in metrics), 4),
    }


def snapshot() -> dict:
    with _lock:
        out = {
            "programs": _totals["programs"],
            "programs_by_kind": {k[9:]: v for k, v in _totals.items() if k.startswith("programs_")},
            "inner_compile_seconds": round(_totals["inner_compile_seconds"], 4),
            "graph_breaks": _totals["graph_breaks"],
            "graph_break_sites": [{"location": loc, "reason": r, "count": c}
                                  for (loc, r), c in _break_counts.most_common(20)],
            "failures": _totals["failures"],
            "recent_failures": [asdict(f) for f in failures],
            "recent_programs": [dict(asdict(p), opaque_ops=list(p.opaque_ops)) for p in programs],
        }
    out.update(_dynamo_frames())
    return out


def clear() -> None:
    with _lock:
        programs.clear()
        graph_breaks.clear()
        failures.clear()
        _totals.clear()
        _break_counts.clear()
        _since[0] = time.time()
