"""The core budget every peer is measured on, and the CPU time it spends.

Two budgets, the same for every peer of a run:

- ``one-core``: the whole process is pinned to one CPU (``os.sched_setaffinity`` on every
  thread that exists when the budget is applied; threads and processes started later inherit
  the mask). That covers the user's thread, the adaptive runtime's device thread
  (``neuron-launch``) and compile thread, autograd's device thread, the compile helper process
  (``runtime/helper.py``, started with ``subprocess.Popen``), inductor's compile workers and the
  C++ compiler they run, and torch.compile's and torch._lazy's own threads: all share the one
  core. torch's intra-op threads: 1.
- ``all-cores``: the process may use every CPU it was allowed at start; torch's intra-op threads
  = that number, so the CPU peers get the cores the adaptive runtime's extra threads use.

``cpu_start()``/``cpu_stop()`` read the process's CPU time (every thread:
``time.process_time``, nanosecond clock) plus that of its descendants: the reaped ones
(``RUSAGE_CHILDREN``, microseconds) and the live ones (the sum of their threads' run time in
``/proc/PID/task/TID/schedstat``, nanoseconds: the compile helper lives as long as the process,
so ``RUSAGE_CHILDREN`` alone would never see it). ``os.times()`` counts in 10 ms clock ticks,
too coarse for a sample of a few dozen milliseconds. ``conditions()`` is what the harness records at each sample, so a
test and a reader of the JSON can check every peer ran under the same mask with the collector on.
"""
from __future__ import annotations

import gc
import os
import resource
import time
from dataclasses import asdict, dataclass

NAMES = ("one-core", "all-cores")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_START = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


@dataclass(frozen=True)
class Budget:
    name: str                  # "one-core" | "all-cores"
    cpus: tuple[int, ...]      # the affinity mask every thread and child gets
    threads: int               # torch.set_num_threads

    def describe(self) -> dict:
        return asdict(self)


def allowed() -> tuple[int, ...]:
    """The CPUs this process could use when it started (before any budget was applied)."""
    if _START is None:
        return tuple(range(os.cpu_count() or 1))
    return tuple(sorted(_START))


def make(name: str, cpu: int | None = None) -> Budget:
    if name not in NAMES:
        raise ValueError(f"unknown budget {name!r}; choose from {', '.join(NAMES)}")
    cpus = allowed()
    if name == "one-core":
        c = cpus[0] if cpu is None else cpu
        if c not in cpus:
            raise ValueError(f"CPU {c} is not among the allowed ones {list(cpus)}")
        return Budget(name, (c,), 1)
    return Budget(name, cpus, len(cpus))


def _tids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


def apply(b: Budget) -> None:
    """Pin every thread of this process to ``b.cpus`` and set torch's intra-op threads. Children
    started later inherit the mask; ``NEURON_LAB_BENCH_THREADS`` tells bench children (W7) the
    thread count."""
    import torch
    if hasattr(os, "sched_setaffinity"):
        for tid in _tids():
            try:
                os.sched_setaffinity(tid, b.cpus)
            except OSError:         # a thread that ended meanwhile
                pass
        os.sched_setaffinity(0, b.cpus)
    torch.set_num_threads(b.threads)
    os.environ["NEURON_LAB_BENCH_THREADS"] = str(b.threads)
    os.environ["NEURON_LAB_BENCH_BUDGET"] = b.name


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    return int(s[s.rindex(")") + 2:].split()[1])


def _run_time(pid: int) -> float:
    """CPU seconds the live process ``pid`` has run so far: its threads' schedstat run times
    (nanoseconds), or its /proc/PID/stat ticks where schedstat is missing."""
    total, seen = 0, False
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = []
    for t in tids:
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
                seen = True
        except (OSError, ValueError, IndexError):
            pass
    if seen:
        return total / 1e9
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
        fields = s[s.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return 0.0


def descendant_pids() -> list[int]:
    """Live descendant processes of this one (children, grandchildren, ...)."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    children: dict[int, list[int]] = {}
    for pid in pids:
        pp = _ppid(pid)
        if pp is not None:
            children.setdefault(pp, []).append(pid)
    out, frontier = [], [os.getpid()]
    while frontier:
        for c in children.get(frontier.pop(), ()):
            if c not in out:
                out.append(c)
                frontier.append(c)
    return out


def descendants() -> dict[int, float]:
    """Live descendant processes of this one: pid -> the CPU seconds they have run so far."""
    return {p: _run_time(p) for p in descendant_pids()}


def _own() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + r.ru_utime + r.ru_stime


def cpu_start() -> float:
    """CPU seconds of the process and its descendants; call it just before a timed window (the
    /proc reads run before the process's own clock is read, so they are not counted)."""
    kids = sum(descendants().values())
    return _own() + kids


def cpu_stop() -> float:
    """As ``cpu_start``, just after a timed window (the process's clock is read first)."""
    own = _own()
    return own + sum(descendants().values())


def _mask(path: str) -> tuple[int, ...] | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    return tuple(_parse_list(line.split(":", 1)[1].strip()))
    except OSError:
        return None
    return None


def _parse_list(s: str) -> list[int]:
    out: list[int] = []
    for part in s.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += range(int(a), int(b) + 1)
        elif part:
            out.append(int(part))
    return out


def conditions() -> dict:
    """What a sample runs under: the distinct affinity masks of this process's threads and of
    its live descendants (and how many of each), torch's intra-op threads, and whether the
    garbage collector is on."""
    import torch
    tids, pids = _tids(), descendant_pids()
    threads = {m for m in (_mask(f"/proc/self/task/{t}/status") for t in tids) if m is not None}
    kids = {m for m in (_mask(f"/proc/{p}/status") for p in pids) if m is not None}
    return {"thread_masks": sorted(list(m) for m in threads),
            "child_masks": sorted(list(m) for m in kids),
            "threads": len(tids), "children": len(pids),
            "torch_threads": torch.get_num_threads(), "gc_enabled": gc.isenabled()}


class GCWatch:
    """Counts the collections the garbage collector runs, and the seconds they take (a
    ``gc.callbacks`` hook installed once; the collector itself stays on)."""

    def __init__(self) -> None:
        import time
        self._perf = time.perf_counter
        self.count = [0, 0, 0]
        self.seconds = 0.0
        self._t0 = None
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = self._perf()
        elif self._t0 is not None:
            self.seconds += self._perf() - self._t0
            self.count[info.get("generation", 0)] += 1
            self._t0 = None

    def snapshot(self) -> tuple[int, int, int, float]:
        return (*self.count, self.seconds)


_watch: GCWatch | None = None


def gc_watch() -> GCWatch:
    global _watch
    if _watch is None:
        _watch = GCWatch()
    return _watch
