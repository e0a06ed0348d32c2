"""The Python storage counter: ``memory``'s counter when the native extension is not built.

The same operations as ``csrc/accounting.cpp`` (which wraps each counted host storage's DataPtr
so that freeing its bytes uncounts them), with the same names, so ``memory`` uses either one.
Here each counted storage gets a weak reference whose callback queues its uncount the moment
the storage dies (PyTorch keeps one Python object per live storage, so the weakref fires when
the C++ storage is freed, not when a Python handle goes away); every read of the counts first
applies the queued uncounts (``_drain``). The callback is a C function (``list.append``), so an
interrupt cannot lose an uncount. It costs ~1.8 us per new storage, the native counter ~0.2 us.
"""
from __future__ import annotations

import threading
import weakref

SEGMENT = 2 << 20


def round_up(n: int) -> int:
    return -(-n // SEGMENT) * SEGMENT


class _Ref(weakref.ref):
    """A storage's weak reference, carrying the key it is counted under."""
    __slots__ = ("key",)


class PyCounter:
    def __init__(self) -> None:
        # Reentrant: creating an entry (tuple, weakref) can run the cyclic GC, which can free
        # another storage and drain on this same thread while the lock is held (a plain Lock
        # deadlocked the adaptive OpInfo sweep).
        self.lock = threading.RLock()
        self.live: dict[int, tuple[weakref.ref, int]] = {}   # id(storage) -> (weakref, nbytes)
        self.dead: list = []      # weak references whose storage died, not uncounted yet
        self.t = {"allocated": 0, "peak": 0, "reserved": 0, "reserved_peak": 0, "n_alloc": 0,
                  "n_free": 0, "bytes_alloc": 0, "bytes_freed": 0, "peak_live": 0}

    def _drain(self) -> None:
        """Uncount the storages that died. Interrupt-safe: a reference leaves ``dead`` only
        after its uncount is complete (dict and integer operations, at which the interpreter
        does not run signal handlers), and an entry is uncounted only if it is still this
        reference's, so a retried drain never uncounts twice nor touches a newer storage that
        reuses the id."""
        with self.lock:
            dead, live, t = self.dead, self.live, self.t
            while dead:
                r = dead[-1]
                entry = live.get(r.key)
                if entry is not None and entry[0] is r:
                    del live[r.key]
                    t["allocated"] -= entry[1]
                    t["n_free"] += 1
                    t["bytes_freed"] += entry[1]
                dead.pop()

    def _raise_peaks(self, current: int) -> None:
        t = self.t
        if current > t["peak"]:
            t["peak"] = current
        if len(self.live) > t["peak_live"]:
            t["peak_live"] = len(self.live)
        if current > t["reserved"]:
            t["reserved"] = round_up(current)
            t["reserved_peak"] = max(t["reserved_peak"], t["reserved"])

    def count_storage(self, storage, capacity: int) -> int:
        """See ``csrc/accounting.cpp``: bytes added, or -1 past ``capacity`` (>= 0)."""
        n = storage.nbytes()
        with self.lock:
            if self.dead:
                self._drain()
            t, key = self.t, id(storage)
            entry = self.live.get(key)
            grow = n - entry[1] if entry is not None else n
            if entry is not None and grow == 0:
                return 0
            if grow > 0 and capacity >= 0 and t["allocated"] + grow > capacity:
                return -1
            if entry is None:
                ref = _Ref(storage, self.dead.append)
                ref.key = key
                self.live[key] = (ref, n)
                t["n_alloc"] += 1
            else:
                self.live[key] = (entry[0], n)
            t["allocated"] += grow
            t["bytes_alloc" if grow > 0 else "bytes_freed"] += abs(grow)
            self._raise_peaks(t["allocated"])
            return grow

    def counted_bytes(self, storage) -> int:
        if self.dead:
            self._drain()
        entry = self.live.get(id(storage))
        return entry[1] if entry is not None else -1

    def allocated_bytes(self) -> int:
        if self.dead:
            self._drain()
        return self.t["allocated"]

    def memory_totals(self) -> tuple:
        self._drain()
        t = self.t
        return (t["allocated"], t["peak"], t["reserved"], t["reserved_peak"], t["n_alloc"],
                t["n_free"], t["bytes_alloc"], t["bytes_freed"], len(self.live), t["peak_live"])

    def observe_allocated(self, current: int) -> None:
        with self.lock:
            self._raise_peaks(current)

    def reset_peaks(self, current: int) -> None:
        with self.lock:
            self.t["peak"] = current
            self.t["reserved_peak"] = self.t["reserved"]
            self.t["peak_live"] = len(self.live)

    def set_reserved(self, current: int) -> None:
        with self.lock:
            self.t["reserved"] = round_up(current)

    def reset_accumulated(self) -> None:
        with self.lock:
            for k in ("n_alloc", "n_free", "bytes_alloc", "bytes_freed"):
                self.t[k] = 0
