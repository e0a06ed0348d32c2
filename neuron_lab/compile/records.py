"""What torch.compile did on ``neuron``: compiled programs, graph breaks, recompiles, fallbacks.

Records are plain dataclasses kept in process-wide lists (bounded); ``snapshot()`` is the
JSON-safe view that ``neuron_lab.metrics()`` shows under ``"compile"``.
"""
from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import asdict, dataclass

_lock = threading.Lock()
_ids = itertools.count(1)
_MAX = 200


@dataclass(frozen=True)
class ProgramRecord:
    graph_id: int
    kind: str            # "forward" | "backward" | "inference"
    nodes: int           # ATen ops in the post-grad graph
    seconds: float       # host-graph rewrite + inductor compile (or FX-graph-cache load)


programs: deque = deque(maxlen=_MAX)
_totals = {"programs": 0, "compile_seconds": 0.0}


def next_graph_id() -> int:
    return next(_ids)


def record_program(gid: int, kind: str, gm, seconds: float) -> None:
    n = sum(1 for node in gm.graph.nodes if node.op == "call_function")
    with _lock:
        programs.append(ProgramRecord(gid, kind, n, round(seconds, 4)))
        _totals["programs"] += 1
        _totals["compile_seconds"] += seconds


def snapshot() -> dict:
    with _lock:
        return {"programs": _totals["programs"],
                "compile_seconds": round(_totals["compile_seconds"], 4),
                "recent_programs": [asdict(p) for p in programs]}


def clear() -> None:
    with _lock:
        programs.clear()
        _totals.update(programs=0, compile_seconds=0.0)
