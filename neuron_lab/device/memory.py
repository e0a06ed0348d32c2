"""Device memory accounting against a modelled HBM capacity.

What is counted: the bytes of every host storage that backs a live ``neuron`` tensor, once per
storage (views share their base's storage and are not counted again). Lifetime is exact: each
storage gets a weak reference whose callback queues its uncount the moment the storage dies
(PyTorch keeps one Python object per live storage, so the weakref fires when the C++ storage is
freed, not when a Python handle goes away); every read of the counts first applies the queued
uncounts (``_drain``). The callback is a C function, so an interrupt cannot lose an uncount.

Reserved memory models a caching allocator: it is the high-water mark of allocated bytes rounded
up to 2 MiB segments, released by ``empty_cache()`` back down to what is allocated.

Capacity: ``NEURON_LAB_HBM_GB`` GiB, default min(96 GiB — one Trainium2 chip — , half of the host's
RAM), so the emulation never promises more than the host can hold. An allocation that would
exceed it raises ``torch.OutOfMemoryError`` *before* any tensor is handed out, so every existing
tensor stays valid.

Deferred outputs (the adaptive runtime hands out tensors before computing them) are not
allocated until their region runs, as on a lazy-tensor device: an intermediate that dies inside
a region is never allocated at all (a fused program does not write it). While a pending output
is alive it still counts in ``memory_allocated()`` (the runtime reports the bytes of its live
pending outputs through ``seam.pending_bytes``, summed only when someone asks), as CUDA counts a
kernel's output at issue; when the region runs, the host storage that receives the value is
counted like any other (``track``). Peaks are raised when bytes are materialised and by every
value ``memory_allocated()`` reports, so ``max_memory_allocated()`` is never below a reported
current value, and intermediates that lived only between two deferred ops never raise it.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import torch

from . import config, events, seam

SEGMENT = 2 << 20
# Reentrant: creating an entry (tuple, weakref) can run the cyclic GC, which can free another
# storage and call ``_freed`` on this same thread while the lock is held (a plain Lock deadlocked
# the adaptive OpInfo sweep in ``settle``).
_lock = threading.RLock()
_live: dict[int, tuple[weakref.ref, int]] = {}   # id(storage) -> (weakref, nbytes)
# Weak references whose storage died and is not uncounted yet. The weakref callback is
# ``_dead.append`` itself, a C function: no Python code runs when a storage dies, so a
# KeyboardInterrupt (or any exception) cannot land in the middle of an uncount and lose it, as
# it did in a Python callback (issue 15: an interrupt there left 9216 B counted after every
# tensor was freed). ``_drain`` does the uncounting before anything reads or writes the counts.
_dead: list = []
_state = {"allocated": 0, "peak": 0, "reserved": 0, "reserved_peak": 0,
          "n_alloc": 0, "n_free": 0, "bytes_alloc": 0, "bytes_freed": 0, "ooms": 0,
          "peak_count": 0}
_capacity: int | None = None


def _host_ram() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 16 << 30


def capacity() -> int:
    global _capacity
    gb = config.HBM_GB.get()
    if gb and gb > 0:
        return int(gb * (1 << 30))
    if _capacity is None:
        _capacity = min(96 << 30, _host_ram() // 2)
    return _capacity


def _round(n: int) -> int:
    return -(-n // SEGMENT) * SEGMENT


class _Ref(weakref.ref):
    """A storage's weak reference, carrying the key it is counted under."""
    __slots__ = ("key",)


def _drain() -> None:
    """Uncount the storages that died. Interrupt-safe: a reference leaves ``_dead`` only after
    its uncount is complete (the steps between ``_live.get`` and ``_dead.pop`` are dict and
    integer operations, at which the interpreter does not run signal handlers), and an entry is
    uncounted only if it is still this reference's (``entry[0] is r``), so a retried drain never
    uncounts twice and never touches a newer storage that reuses the id."""
    with _lock:
        while _dead:
            r = _dead[-1]
            entry = _live.get(r.key)
            if entry is not None and entry[0] is r:
                del _live[r.key]
                n = entry[1]
                _state["allocated"] -= n
                _state["n_free"] += 1
                _state["bytes_freed"] += n
            _dead.pop()


def is_counted(storage) -> bool:
    if _dead:
        _drain()
    return id(storage) in _live


def untracked_bytes(storages) -> int:
    """Bytes of the storages in ``storages`` that are not yet counted (new allocations)."""
    if _dead:
        _drain()
    return sum(s.nbytes() for s in storages if id(s) not in _live)


def check(requested: int, op: str) -> None:
    """Raise OutOfMemoryError if ``requested`` more bytes would exceed the capacity."""
    cap = capacity()
    if _dead:
        _drain()
    if requested and _state["allocated"] + requested > cap:
        alloc = _state["allocated"] + seam.pending_bytes()
        if alloc + requested <= cap:
            return
        _state["ooms"] += 1
        events.emit(events.OOM, requested=requested, allocated=alloc, capacity=cap)  # kept if unheard
        raise torch.OutOfMemoryError(
            f"neuron: out of memory on device neuron:0 in {op}: tried to allocate {_fmt(requested)} "
            f"({requested} bytes) with {_fmt(alloc)} ({alloc} bytes) allocated of {_fmt(cap)} "
            f"({cap} bytes) modelled HBM capacity. Free tensors you no longer need (del x), or raise "
            f"the capacity with NEURON_LAB_HBM_GB. Every existing tensor is unchanged.")


def _watch(storage) -> weakref.ref:
    """A weak reference that queues ``storage``'s uncount the moment it dies (see ``_dead``)."""
    r = _Ref(storage, _dead.append)
    r.key = id(storage)
    return r


def _count(storage, n: int) -> None:
    # Under the lock: threads allocate concurrently (eager mode takes no engine lock) and a
    # storage dying in another thread runs ``_freed`` there; ``+=`` on the totals is a
    # read-modify-write the interpreter can switch threads in.
    ref = _watch(storage)
    with _lock:
        if _dead:
            _drain()
        _live[id(storage)] = (ref, n)
        s = _state
        s["allocated"] += n
        s["n_alloc"] += 1
        s["bytes_alloc"] += n
        _raise_peaks(s)


def track(storage, op: str | None = None) -> None:
    """Count ``storage`` as device memory until it dies (no-op if already counted). With ``op``,
    first check the capacity (OutOfMemoryError naming ``op``)."""
    if _dead:
        _drain()
    if id(storage) in _live:
        return
    n = storage.nbytes()
    if op is not None and _state["allocated"] + n > capacity():
        check(n, op)
    _count(storage, n)


def _raise_peaks(s: dict) -> None:
    if s["allocated"] > s["peak"]:
        s["peak"] = s["allocated"]
    if len(_live) > s["peak_count"]:
        s["peak_count"] = len(_live)
    if s["allocated"] > s["reserved"]:
        s["reserved"] = _round(s["allocated"])
        if s["reserved"] > s["reserved_peak"]:
            s["reserved_peak"] = s["reserved"]


def counted_bytes(storage) -> int | None:
    """The bytes ``storage`` is counted with, or None if it is not counted."""
    if _dead:
        _drain()
    entry = _live.get(id(storage))
    return entry[1] if entry is not None else None


def retrack(storage) -> None:
    """A counted storage changed size in place (``resize_``): update its bytes."""
    if _dead:
        _drain()
    key = id(storage)
    entry = _live.get(key)
    if entry is None:
        track(storage)
        return
    n = storage.nbytes()
    if n != entry[1]:
        with _lock:
            _live[key] = (entry[0], n)
            _state["allocated"] += n - entry[1]
            # totals stay consistent: freed never exceeds allocated
            _state["bytes_alloc" if n > entry[1] else "bytes_freed"] += abs(n - entry[1])
            _raise_peaks(_state)


def counted() -> int:
    """Bytes of the materialised storages (the device's own checks: no pending outputs summed)."""
    if _dead:
        _drain()
    return _state["allocated"]


def memory_allocated(device=None) -> int:
    """Materialised bytes plus the live pending outputs' (a reported value raises the peaks)."""
    if _dead:
        _drain()
    pend = seam.pending_bytes()
    n = _state["allocated"] + pend
    if pend and (n > _state["peak"] or n > _state["reserved"]):
        with _lock:
            s = _state
            if n > s["peak"]:
                s["peak"] = n
            if n > s["reserved"]:
                s["reserved"] = _round(n)
                s["reserved_peak"] = max(s["reserved_peak"], s["reserved"])
    return n


def max_memory_allocated(device=None) -> int:
    memory_allocated()
    return _state["peak"]


def memory_reserved(device=None) -> int:
    return _state["reserved"]


def max_memory_reserved(device=None) -> int:
    return _state["reserved_peak"]


def reset_peak_memory_stats(device=None) -> None:
    _drain()
    n = _state["allocated"] + seam.pending_bytes()
    with _lock:
        _state["peak"] = n
        _state["reserved_peak"] = _state["reserved"]
        _state["peak_count"] = len(_live)


def reset_accumulated_memory_stats(device=None) -> None:
    with _lock:
        for k in ("n_alloc", "n_free", "bytes_alloc", "bytes_freed", "ooms"):
            _state[k] = 0


def empty_cache() -> None:
    _drain()
    n = _state["allocated"] + seam.pending_bytes()
    with _lock:
        _state["reserved"] = _round(n)


def mem_get_info(device=None) -> tuple[int, int]:
    _drain()
    cap = capacity()
    return cap - _state["reserved"], cap


def live_storages() -> int:
    _drain()
    return len(_live)


def memory_stats(device=None) -> dict[str, Any]:
    """Same key names as ``torch.cuda.memory_stats`` where they apply (pool: ``all`` only)."""
    now = memory_allocated()
    s = _state
    out: dict[str, Any] = {}
    for name, cur, peak, alloc, freed in (
            ("allocated_bytes", now, s["peak"], s["bytes_alloc"], s["bytes_freed"]),
            ("active_bytes", now, s["peak"], s["bytes_alloc"], s["bytes_freed"]),
            ("reserved_bytes", s["reserved"], s["reserved_peak"], s["reserved_peak"],
             s["reserved_peak"] - s["reserved"]),
            ("allocation", len(_live), s["peak_count"], s["n_alloc"], s["n_free"])):
        out[f"{name}.all.current"] = cur
        if peak is not None:
            out[f"{name}.all.peak"] = peak
        out[f"{name}.all.allocated"] = alloc
        out[f"{name}.all.freed"] = freed
    out.update({"num_ooms": s["ooms"], "num_alloc_retries": 0,
                "num_device_alloc": s["n_alloc"], "num_device_free": s["n_free"],
                "capacity_bytes": capacity()})
    return out


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A readable table in the spirit of ``torch.cuda.memory_summary``."""
    now = memory_allocated()
    s = _state
    cap = capacity()
    rows = [("Allocated memory", now, s["peak"], s["bytes_alloc"], s["bytes_freed"]),
            ("Reserved memory", s["reserved"], s["reserved_peak"], None, None)]
    w = 75
    lines = ["=" * w,
             f"  neuron:0 memory summary (emulated Trainium2 HBM, capacity {_fmt(cap)})".ljust(w),
             "-" * w,
             f"{'Metric':<22}|{'Cur Usage':>12} |{'Peak Usage':>12} |{'Tot Alloc':>11} |{'Tot Freed':>10}",
             "-" * w]
    for name, cur, peak, alloc, freed in rows:
        lines.append(f"{name:<22}|{_fmt(cur):>12} |{_fmt(peak):>12} |"
                     f"{_fmt(alloc) if alloc is not None else '':>11} |"
                     f"{_fmt(freed) if freed is not None else '':>10}")
    lines.append(f"{'Live storages':<22}|{len(_live):>12} |{'':>12} |{s['n_alloc']:>11} |{s['n_free']:>10}")
    lines.append(f"{'Free (of capacity)':<22}|{_fmt(cap - s['reserved']):>12} |")
    lines.append(f"{'OOMs':<22}|{s['ooms']:>12} |")
    lines.append("=" * w)
    return "\n".join(lines)
