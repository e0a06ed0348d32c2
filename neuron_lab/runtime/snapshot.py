"""Read-only views of what a runtime holds, for the layers above it (telemetry, Jupyter, the
benchmark): a region's facts and figures (``RegionSnapshot``) and the launch counters
(``LaunchCounts``). They are copies taken at the call: reading one never touches the engine's
queue, trie or regions, and holding one keeps nothing of the engine alive.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


def _median_us(xs: list) -> float | None:
    return sorted(xs)[len(xs) // 2] * 1e6 if xs else None


@dataclass(frozen=True, slots=True)
class RegionSnapshot:
    """One cached region as it stood when the snapshot was taken.

    ``keys`` and ``metas`` describe its ops as the runtime recorded them (op key: the op's
    facts and its argument wiring; metas: each output's size, stride, offset and dtype), which
    is what the cost model prices. ``where`` is the user's line that issued its first op (a
    ``tracking`` location token)."""
    id: int
    ops: int
    hits: int
    status: str
    names: tuple
    keys: tuple
    metas: tuple
    where: object
    per_op_us: float | None
    fused_us: float | None
    compile_s: float | None
    fused_launches: int
    per_op_launches: int
    error: str | None
    relaid_outputs: int
    widened: int

    @classmethod
    def of(cls, region) -> RegionSnapshot:
        """The snapshot of ``cache.Region`` ``region``."""
        return cls(id=region.id, ops=region.ops, hits=region.hits,
                   status=region.status.value, names=tuple(region.names),
                   keys=region.keys, metas=tuple(region.metas),
                   where=getattr(region.node, "where", None),
                   per_op_us=_median_us(region.per_op_s), fused_us=_median_us(region.fused_s),
                   compile_s=region.compile_s, fused_launches=region.fused_launches,
                   per_op_launches=region.per_op_launches, error=region.error,
                   relaid_outputs=len(region.relayout[1]) if region.relayout else 0,
                   widened=region.widened)

    def summary(self) -> dict:
        """JSON-safe: what ``%neuron_regions``, the panel and ``metrics()`` show."""
        return {"id": self.id, "ops": self.ops, "hits": self.hits, "status": self.status,
                "per_op_us": self.per_op_us, "fused_us": self.fused_us,
                "compile_s": self.compile_s, "fused_launches": self.fused_launches,
                "per_op_launches": self.per_op_launches, "error": self.error,
                "relaid_outputs": self.relaid_outputs, "widened": self.widened,
                "first_ops": list(self.names[:6])}


class LaunchCounts(NamedTuple):
    """Launches since the runtime's counters started: per-op ones (captured ops, replays,
    boundary ops) and fused programs, the ops each kind ran, and the device thread's share."""
    per_op: int
    fused: int
    ops_per_op: int
    ops_fused: int
    on_device_thread: int       # launches the device's thread ran (nobody waited for them)
    device_thread_busy_s: float
