"""Device memory accounting against a modelled HBM capacity.

What is counted: the bytes of every host storage that backs a live ``neuron`` tensor, once per
storage (views share their base's storage and are not counted again). Lifetime is exact: the
counter uncounts a storage's bytes when they are freed. The counter is ``csrc/accounting.cpp``
(it wraps the storage's DataPtr: the free itself uncounts, in whatever thread it happens,
~0.2 us per new tensor) when the native extension is built and the executor is the CPU, else
``counting.PyCounter`` (a weak reference per storage, ~1.8 us); both have the same operations,
so this module reads one.

Reserved memory models a caching allocator: it is the high-water mark of allocated bytes rounded
up to 2 MiB segments, released by ``empty_cache()`` back down to what is allocated.

Capacity: ``NEURON_LAB_HBM_GB`` GiB, default min(the chip's HBM — 96 GiB on Trainium2, 144 GiB on
Trainium3, ``chips.py`` — , half of the host's RAM), so the emulation never promises more than
the host can hold. An allocation that would
exceed it raises ``torch.OutOfMemoryError`` *before* any tensor is handed out, so every existing
tensor stays valid.

Deferred outputs (the adaptive runtime hands out tensors before computing them) are not
allocated until their region runs, as on a lazy-tensor device: an intermediate that dies inside
a region is never allocated at all (a fused program does not write it). While a pending output
is alive it still counts in ``memory_allocated()`` (the runtime reports the bytes of its live
pending outputs through ``runtime_interface.pending_bytes``, summed only when someone asks), as CUDA
counts a kernel's output at issue; when the region runs, the host storage that receives the value is
counted like any other (``track``). Peaks are raised when bytes are materialised and by every
value ``memory_allocated()`` reports, so ``max_memory_allocated()`` is never below a reported
current value, and intermediates that lived only between two deferred ops never raise it.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from . import chips, config, counting, events, runtime_interface

SEGMENT = counting.SEGMENT
_counter: Any = counting.PyCounter()     # the native counter replaces it (use_native)
_count = _counter.count_storage
_allocated = _counter.allocated_bytes
_ooms = 0
_capacity: tuple[str, int] | None = None     # (chip, default capacity) for the chip last read


def use_native(ext) -> None:
    """Count with the native extension's counter (before any neuron tensor exists). The native
    direct kernel counts against the capacity too: it follows ``NEURON_LAB_HBM_GB``."""
    global _counter, _count, _allocated
    _counter, _count, _allocated = ext, ext.count_storage, ext.allocated_bytes

    def follow() -> None:
        try:
            ext.set_direct_capacity(capacity())
        except config.ConfigError:    # a bad NEURON_LAB_HBM_GB: raised where it is read
            ext.set_direct_capacity(0)
    follow()
    config.HBM_GB.watch(follow)
    config.CHIP.watch(follow)           # the default capacity is the chip's HBM


def _host_ram() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 16 << 30


def capacity() -> int:
    """The modelled HBM capacity: ``NEURON_LAB_HBM_GB`` GiB, else the chip's HBM (chips.py),
    bounded by half of the host's RAM (the executor holds the data there)."""
    global _capacity
    gb = config.HBM_GB.get()
    if gb and gb > 0:
        return int(gb * (1 << 30))
    chip = chips.current()
    if _capacity is None or _capacity[0] != chip.key:
        _capacity = (chip.key, min(chip.hbm_bytes, _host_ram() // 2))
    return _capacity[1]


def check(requested: int, op: str) -> None:
    """Raise OutOfMemoryError if ``requested`` more bytes would exceed the capacity."""
    global _ooms
    cap = capacity()
    if not requested or _allocated() + requested <= cap:
        return
    alloc = _allocated() + runtime_interface.pending_bytes()
    if alloc + requested <= cap:
        return
    _ooms += 1
    events.emit(events.OOM, requested=requested, allocated=alloc, capacity=cap)  # kept if unheard
    raise torch.OutOfMemoryError(
        f"neuron: out of memory on device neuron:0 in {op}: tried to allocate {_fmt(requested)} "
        f"({requested} bytes) with {_fmt(alloc)} ({alloc} bytes) allocated of {_fmt(cap)} "
        f"({cap} bytes) modelled HBM capacity. Free tensors you no longer need (del x), or raise "
        f"the capacity with NEURON_LAB_HBM_GB. Every existing tensor is unchanged.")


def track(storage, op: str | None = None) -> None:
    """Count host ``storage`` as device memory until its bytes are freed (no-op if counted; a
    storage resized in place is recounted). With ``op``, first check the capacity
    (OutOfMemoryError naming ``op``; nothing counted)."""
    if _count(storage, capacity() if op is not None else -1) == -1:
        old = _counter.counted_bytes(storage)
        check(storage.nbytes() - max(old, 0), op)   # raises, with the message
        _count(storage, -1)


retrack = track        # a counted storage changed size in place (resize_): count its new size


def is_counted(storage) -> bool:
    return _counter.counted_bytes(storage) >= 0


def untracked_bytes(storages) -> int:
    """Bytes of the storages in ``storages`` that are not yet counted (new allocations)."""
    return sum(s.nbytes() for s in storages if _counter.counted_bytes(s) < 0)


def counted_bytes(storage) -> int | None:
    """The bytes ``storage`` is counted with, or None if it is not counted."""
    n = _counter.counted_bytes(storage)
    return n if n >= 0 else None


def counted() -> int:
    """Bytes of the materialised storages (the device's own checks: no pending outputs summed)."""
    return _allocated()


def memory_allocated(device=None) -> int:
    """Materialised bytes plus the live pending outputs' (a reported value raises the peaks)."""
    pend = runtime_interface.pending_bytes()
    n = _allocated() + pend
    if pend:
        _counter.observe_allocated(n)
    return n


def max_memory_allocated(device=None) -> int:
    memory_allocated()
    return _counter.memory_totals()[1]


def memory_reserved(device=None) -> int:
    return _counter.memory_totals()[2]


def max_memory_reserved(device=None) -> int:
    return _counter.memory_totals()[3]


def reset_peak_memory_stats(device=None) -> None:
    _counter.reset_peaks(_allocated() + runtime_interface.pending_bytes())


def reset_accumulated_memory_stats(device=None) -> None:
    global _ooms
    _counter.reset_accumulated()
    _ooms = 0


def empty_cache() -> None:
    _counter.set_reserved(_allocated() + runtime_interface.pending_bytes())


def mem_get_info(device=None) -> tuple[int, int]:
    cap = capacity()
    return cap - memory_reserved(), cap


def live_storages() -> int:
    return _counter.memory_totals()[8]


def memory_stats(device=None) -> dict[str, Any]:
    """Same key names as ``torch.cuda.memory_stats`` where they apply (pool: ``all`` only)."""
    now = memory_allocated()
    (_, peak, reserved, reserved_peak, n_alloc, n_free, bytes_alloc, bytes_freed, live,
     peak_live) = _counter.memory_totals()
    out: dict[str, Any] = {}
    for name, cur, top, alloc, freed in (
            ("allocated_bytes", now, peak, bytes_alloc, bytes_freed),
            ("active_bytes", now, peak, bytes_alloc, bytes_freed),
            ("reserved_bytes", reserved, reserved_peak, reserved_peak, reserved_peak - reserved),
            ("allocation", live, peak_live, n_alloc, n_free)):
        out[f"{name}.all.current"] = cur
        out[f"{name}.all.peak"] = top
        out[f"{name}.all.allocated"] = alloc
        out[f"{name}.all.freed"] = freed
    out.update({"num_ooms": _ooms, "num_alloc_retries": 0,
                "num_device_alloc": n_alloc, "num_device_free": n_free,
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
    (_, peak, reserved, reserved_peak, n_alloc, n_free, bytes_alloc, bytes_freed, live,
     _peak_live) = _counter.memory_totals()
    cap = capacity()
    rows = [("Allocated memory", now, peak, bytes_alloc, bytes_freed),
            ("Reserved memory", reserved, reserved_peak, None, None)]
    w = 75
    lines = ["=" * w,
             f"  neuron:0 memory summary (emulated {chips.current().name} HBM, capacity {_fmt(cap)})".ljust(w),
             "-" * w,
             f"{'Metric':<22}|{'Cur Usage':>12} |{'Peak Usage':>12} |{'Tot Alloc':>11} |{'Tot Freed':>10}",
             "-" * w]
    for name, cur, top, alloc, freed in rows:
        lines.append(f"{name:<22}|{_fmt(cur):>12} |{_fmt(top):>12} |"
                     f"{_fmt(alloc) if alloc is not None else '':>11} |"
                     f"{_fmt(freed) if freed is not None else '':>10}")
    lines.append(f"{'Live storages':<22}|{live:>12} |{'':>12} |{n_alloc:>11} |{n_free:>10}")
    lines.append(f"{'Free (of capacity)':<22}|{_fmt(cap - reserved):>12} |")
    lines.append(f"{'OOMs':<22}|{_ooms:>12} |")
    lines.append("=" * w)
    return "\n".join(lines)
