"""The kernel side of the side panel: the ``neuron_lab`` comm target.

Every open comm (one per panel/notebook view; several at once are fine) gets ``hello`` and a
``snapshot``. While a cell runs, the sampler thread pushes ``memory`` and ``running`` at the
push rate (default 4 Hz) and ``fallback`` rows when new ones appear (only the rows that are new
or whose count moved: the panel upserts by (op, reason)); at cell end ``cell`` and a fresh
``snapshot``. While idle, the change watcher (1 Hz, a few counters) pushes ``memory`` and a
``snapshot`` only when something moved: a background compile finished, a user thread
allocated or fell back. Messages from the frontend are limited to the schema in ``protocol.py``
(``request``, ``set_rate``): the panel can never make the kernel run code. A kernel restart is
a new process: the panel simply opens a new comm.

Two ways a comm opens. The kernel opens one at ``%load_ext`` (``open_from_kernel``; its
``comm_open`` carries ``hello``): it goes out on iopub at once, so the panel (which registers the
``neuron_lab`` comm target on every notebook kernel) is live while the same or the next cell is
still running — a frontend's ``comm_open`` waits on the shell channel behind a busy cell, which
left the panel "not loaded" for the whole of a Run All. The frontend may also open one (panel
opened later, page reload): the target registered here answers it with ``hello``. A frontend
without the target closes the kernel's comm, and it is dropped like any closed comm.
"""
from __future__ import annotations

import threading

from .. import __version__, runtime
from ..device import chips, executor, memory, tracking
from ..telemetry import advise, cells, metrics, store
from ..telemetry.sampler import Sampler
from ..telemetry.watch import ChangeWatcher
from . import protocol as P

ADVICE_SHOWN = 5


def _summary_regions() -> dict:
    s = runtime.stats()
    return {"count": s["regions"], "hit_rate": s["hit_rate"], "hits": s["hits"],
            "misses": s["misses"], "compiles_pending": s["compiles_pending"],
            "compiles_failed": s["compiles_failed"], "fused_share": s["fused_share"]}


def snapshot_body() -> dict:
    m = metrics()
    return {"memory": m["memory"], "fallbacks": m["fallbacks"], "cells": m["cells"][-20:],
            "running": cells.live(), "regions": _summary_regions(), "counters": m["counters"],
            "cell_ids": {str(n): cid for n, cid in list(cells.cell_ids.items())[-200:]},
            "advice": _advice(), "distributed": m["distributed"],
            "compiled": compiled_summary(m["torch_compile"])}


def compiled_summary(tc: dict) -> dict:
    """The panel's "Compiled graphs" section: torch.compile's totals, and its latest recompiles
    (with the guard that failed), graph breaks (source line, reason) and compile failures."""
    return {"frames": tc["frames"], "programs": tc["programs"], "recompiles": tc["recompiles"],
            "graph_breaks": tc["graph_breaks"], "failures": tc["failures"],
            "compile_s": tc["dynamo_compile_seconds"],
            "rows": ([{"kind": "recompile", "location": r["location"],
                       "detail": f"{r['function']}: {r['failed_guard']}", "count": 1}
                      for r in tc["recent_recompiles"][-5:]]
                     + [{"kind": "graph break", "location": b["location"], "detail": b["reason"],
                         "count": b["count"]} for b in tc["graph_break_sites"][:5]]
                     + [{"kind": "failure", "location": f["location"],
                         "detail": f"{f['error']} (ran {f['fallback']})", "count": 1}
                        for f in tc["recent_failures"][-3:]])}


def _advice() -> list[dict]:
    """The advisor's top findings for the panel (never fails a snapshot)."""
    try:
        return advise()[:ADVICE_SHOWN]
    except Exception as e:
        return [{"kind": "advisor-error", "where": "", "message": f"{type(e).__name__}: {e}",
                 "fix": "", "modelled_s": 0.0, "count": 0}]


class Endpoint:
    def __init__(self, sampler: Sampler, watcher: ChangeWatcher | None = None) -> None:
        self.sampler = sampler
        self.watcher = watcher
        self.comms: list = []
        self.lock = threading.Lock()
        self._fallback_seen = store.fallback_seq
        self._fallback_pushed = {(r["op"], r["reason"]): r["count"]
                                 for r in tracking.fallback_ops()}
        self._registered = False

    # --- lifecycle ------------------------------------------------------------------------
    def register(self) -> None:
        from comm import get_comm_manager
        get_comm_manager().register_target(P.TARGET, self._on_open)
        self.sampler.listeners.append(self._on_sample)
        if self.watcher is not None:
            self.watcher.listeners.append(self._on_idle_change)
        self._registered = True

    def unregister(self) -> None:
        if not self._registered:
            return
        from comm import get_comm_manager
        try:
            get_comm_manager().unregister_target(P.TARGET, self._on_open)
        except Exception:
            pass
        if self._on_sample in self.sampler.listeners:
            self.sampler.listeners.remove(self._on_sample)
        if self.watcher is not None and self._on_idle_change in self.watcher.listeners:
            self.watcher.listeners.remove(self._on_idle_change)
        for c in list(self.comms):
            try:
                c.close()
            except Exception:
                pass
        self.comms.clear()
        self._registered = False

    def hello(self, hz: float | None = None) -> dict:
        return P.message(P.HELLO, neuron_lab=__version__, executor=executor.executor_name(),
                         mode=runtime.get_mode(), capacity=memory.capacity(),
                         chip=chips.current().name, push_hz=self.sampler.hz if hz is None else hz)

    def _attach(self, comm) -> None:
        with self.lock:
            self.comms.append(comm)
        comm.on_msg(lambda msg, c=comm: self._on_msg(c, msg))
        comm.on_close(lambda msg, c=comm: self._drop(c))

    def _on_open(self, comm, open_msg) -> None:
        self._attach(comm)
        comm.send(self.hello())
        comm.send(P.message(P.SNAPSHOT, **snapshot_body()))

    def open_from_kernel(self) -> None:
        """Open a comm from the kernel side (``comm_open`` on iopub, ``hello`` as its data),
        then send a ``snapshot``: pushes reach the panel while cells are busy."""
        from comm import create_comm
        c = create_comm(target_name=P.TARGET, data=self.hello())
        self._attach(c)
        c.send(P.message(P.SNAPSHOT, **snapshot_body()))

    def _drop(self, comm) -> None:
        with self.lock:
            if comm in self.comms:
                self.comms.remove(comm)

    def _on_msg(self, comm, msg) -> None:
        data = msg.get("content", {}).get("data", {}) or {}
        kind = data.get("type")
        if kind == P.REQUEST and data.get("what", "snapshot") == "snapshot":
            comm.send(P.message(P.SNAPSHOT, **snapshot_body()))
        elif kind == P.SET_RATE:
            try:
                hz = self.sampler.set_rate(float(data.get("hz")))
            except (TypeError, ValueError):
                comm.send(P.message(P.ERROR, message=f"set_rate needs a number, got {data.get('hz')!r}"))
                return
            comm.send(self.hello(hz))
        else:
            comm.send(P.message(P.ERROR, message=f"unsupported request type {kind!r}; "
                                                 f"accepted: {', '.join(P.FRONTEND_TYPES)}"))

    # --- pushes ---------------------------------------------------------------------------
    def broadcast(self, msg: dict) -> None:
        with self.lock:
            targets = list(self.comms)
        for c in targets:
            try:
                c.send(msg)
            except Exception:
                self._drop(c)

    def _on_sample(self, sample: dict) -> None:
        if not self.comms:
            return
        self.broadcast(P.message(P.MEMORY, **sample))
        self.broadcast(P.message(P.RUNNING, **cells.live()))
        self.push_fallbacks()

    def push_fallbacks(self) -> None:
        """Push the fallback rows that are new or whose count moved since the last push."""
        seq = store.fallback_seq
        if seq == self._fallback_seen:
            return
        self._fallback_seen = seq
        rows = tracking.fallback_ops()
        pushed = self._fallback_pushed
        new = [r for r in rows if pushed.get((r["op"], r["reason"])) != r["count"]]
        self._fallback_pushed = {(r["op"], r["reason"]): r["count"] for r in rows}
        if new:
            self.broadcast(P.message(P.FALLBACK, rows=new))

    def _on_idle_change(self) -> None:
        if not self.comms or cells.running:
            return
        self.push_fallbacks()
        self.broadcast(P.message(P.MEMORY, **store.sample_memory()))
        self.broadcast(P.message(P.SNAPSHOT, **snapshot_body()))

    def cell_finished(self, record: dict | None) -> None:
        if not self.comms:
            return
        self.push_fallbacks()
        if record is not None:
            self.broadcast(P.message(P.CELL, record=record))
        self.broadcast(P.message(P.MEMORY, **store.sample_memory()))
        self.broadcast(P.message(P.SNAPSHOT, **snapshot_body()))
