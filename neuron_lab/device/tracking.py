"""Op tracking: which ops ran on the device, which fell back and where, and the sync points.

The per-op part is one dict increment (``count_op``), cheap enough for the hot path. Fallbacks
and sync points are rare by comparison; they record the user's source line, which is the first
stack frame outside torch, neuron_lab and the Python standard library's plumbing (for ops of a
backward pass, which PyTorch runs on a device thread, the line that called ``backward()``).

Public surface (re-exported as ``neuron_lab.executed_ops`` etc.):
``executed_ops()``, ``fallback_ops()``, ``clear_op_tracking()``, ``counters()``.
"""
from __future__ import annotations

import linecache
import os
import sys
import threading
import time
import warnings
from collections import Counter
from typing import Any

import torch

from . import events

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Frames that are not the user's code: files under these prefixes, or with these names
# (``user_frame_token`` skips them; the runtime's C capture walks frames with the same rule).
NOT_USER_PREFIXES = (_TORCH_DIR, _PKG_DIR, "<frozen")
NOT_USER_FILES = ("contextlib.py", "functools.py")

_lock = threading.Lock()
# op name -> count; mutated on the hot path without the lock (the native direct kernel's runs
# are counted in C++ and added here when read: executed_ops(), counters())
executed: Counter = Counter()
_fallbacks: dict[tuple[str, str], dict[str, Any]] = {}
_syncs: Counter = Counter()
_transfer = {"h2d_bytes": 0, "d2h_bytes": 0, "h2d_count": 0, "d2h_count": 0}
_collective = {"collectives": 0, "collective_bytes": 0, "collective_s": 0.0}
_collective_ops: Counter = Counter()
_warned: set[tuple[str, str]] = set()
_seq = 0


def _first_user_frame(f):
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(NOT_USER_PREFIXES) and not fn.endswith(NOT_USER_FILES):
            return f
        f = f.f_back
    return None


# The user's line of each ``backward()`` in progress, by the thread that called it (set by
# ``patches.backward`` around autograd's engine): a device thread's stack holds no user code.
_backward_callers: dict[int, Any] = {}


def backward_started() -> tuple:
    """Remember the line calling ``backward()`` on this thread (the engine may run the pass on a
    device thread); returns what ``backward_ended`` restores (a reentrant backward nests)."""
    tid = threading.get_ident()
    prev = _backward_callers.get(tid)
    _backward_callers[tid] = user_frame_token(3, waiting=False)
    return tid, prev


def backward_ended(saved: tuple) -> None:
    tid, prev = saved
    if prev is None:
        _backward_callers.pop(tid, None)
    else:
        _backward_callers[tid] = prev


def _waiting_caller():
    """The line that called the ``backward()`` in progress, for an op with no user frame on its
    own stack (PyTorch runs a device's backward pass on its own thread, whose stack holds no user
    code). Read from what ``backward_started`` recorded: walking other threads' stacks instead
    (``sys._current_frames()``, ``f_back``) crashed the process when the thread walked was
    running (a compile thread importing modules: a segfault in ``f_back``), and kept this
    thread's own frame in a reference cycle that held its callers' locals alive."""
    callers = list(_backward_callers.values())
    return callers[-1] if callers else None


def user_frame_token(skip: int = 2, waiting: bool = True):
    """(filename, line) of the first user frame, cheaply (~1.5 us), for formatting later with
    ``format_location``; None if there is none. Holds no frame (no locals kept alive).
    ``waiting=False``: do not fall back to the line of a ``backward()`` in progress (sync points
    and flushes run on the caller's thread)."""
    f = _first_user_frame(sys._getframe(skip))
    if f is not None:
        return f.f_code.co_filename, f.f_lineno
    return _waiting_caller() if waiting else None


def _cell_name(fn: str) -> str | None:
    """IPython's own name for the code of a cell ("In[3]"), as its tracebacks print it, or
    None: not running under IPython, or not a cell's code. IPython keeps the map from the
    compiled file name (ipykernel: a hash under /tmp) to the execution count on its compiler."""
    ipy = sys.modules.get("IPython")
    if ipy is None:
        return None
    try:
        shell = ipy.get_ipython()
        label = None if shell is None else shell.compile.format_code_name(fn)
    except Exception:              # an older or a stripped-down shell: plain file names
        return None
    return None if label is None else label[1]


def format_location(token) -> tuple[str, str]:
    """(location, source text) of a ``user_frame_token``: ``Cell In[3], line 4`` for a
    notebook or IPython cell (what IPython's tracebacks say), else ``file.py:line``."""
    if token is None:
        return "<unknown>:0", ""
    fn, line = token
    cell = _cell_name(fn)
    if cell is not None:      # not cached: a cell run again keeps its file, not its number
        return f"Cell {cell}, line {line}", linecache.getline(fn, line).strip()
    key = (fn, line, os.getcwd())
    found = _file_lines.get(key)
    if found is None:
        if len(_file_lines) >= 4096:
            _file_lines.clear()
        found = _file_lines[key] = _file_location(fn, line)
    return found


# A file's location formatted once per line and working directory: a fallback in a loop records
# its line every call (the relative path and the source line took ~8 us of an eager dropout).
_file_lines: dict = {}


def _file_location(fn: str, line: int) -> tuple[str, str]:
    try:
        rel = os.path.relpath(fn)
        name = rel if not rel.startswith("..") else os.path.basename(fn)
    except ValueError:
        name = os.path.basename(fn)
    return f"{name}:{line}", linecache.getline(fn, line).strip()


def user_location(skip: int = 2) -> tuple[str, str]:
    """(``file:line``, source text) of the first frame that is the user's code. ``skip``: frames
    of this package certainly between here and the user's; never more (the generic kernel and
    the engine's launch are C: how many Python frames an op passes through depends on its path),
    ``_first_user_frame`` walks past the rest."""
    return format_location(user_frame_token(skip + 1))


def count_op(name: str) -> None:
    executed[name] += 1


def record_fallback(op: str, reason: str) -> str:
    """Record one fallback of ``op``; returns the user's location it was attributed to."""
    global _seq
    loc, src = user_location(2)
    with _lock:
        _seq += 1
        rec = _fallbacks.get((op, reason))
        if rec is None:
            rec = _fallbacks[(op, reason)] = {"op": op, "reason": reason, "count": 0,
                                              "locations": {}, "source": {}, "first_seq": _seq,
                                              "first_seen": time.time()}
        rec["count"] += 1
        rec["locations"][loc] = rec["locations"].get(loc, 0) + 1
        rec["source"].setdefault(loc, src)
        rec["last_seq"], rec["last_seen"] = _seq, time.time()
    events.emit(events.FALLBACK, op=op, reason=reason, location=loc)   # kept if unheard
    return loc


def warn_once(op: str, loc: str, message: str) -> None:
    if (op, loc) not in _warned:
        _warned.add((op, loc))
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def record_sync(reason: str) -> None:
    _syncs[reason] += 1
    if events.active():
        events.emit(events.SYNC, reason=reason, where=user_frame_token(2, waiting=False))


def record_transfer(direction: str, nbytes: int) -> None:
    _transfer[f"{direction}_bytes"] += nbytes
    _transfer[f"{direction}_count"] += 1
    if events.active():
        events.emit(events.TRANSFER, direction=direction, nbytes=nbytes)


def record_collective(op: str, nbytes: int, seconds: float) -> None:
    """One finished collective (``all_reduce``...): its payload bytes and seconds from issue to
    completion. Called from the transport's thread when the collective completes."""
    with _lock:
        _collective["collectives"] += 1
        _collective["collective_bytes"] += nbytes
        _collective["collective_s"] += seconds
        _collective_ops[op] += 1
    if events.active():
        events.emit(events.COLLECTIVE, op=op, nbytes=nbytes, seconds=seconds)


def collective_ops() -> dict[str, int]:
    """{collective name: count} of the collectives run on neuron tensors."""
    with _lock:
        return dict(_collective_ops)


_native_counts: list = []   # ops counted in C++: callables returning {op: runs since last call}


def count_native(counts) -> None:
    """Add the ops a native path counts in C++ (the direct kernel's runs, the adaptive engine's
    deferrals) to ``executed`` when it is read; ``counts()`` returns {op name: runs since its
    last call}."""
    if counts not in _native_counts:
        _native_counts.append(counts)


def _drain() -> None:
    for counts in _native_counts:
        for name, n in counts().items():
            executed[name] += n


def executed_ops() -> dict[str, int]:
    _drain()
    return dict(executed)


def fallback_ops() -> list[dict[str, Any]]:
    """One row per (op, reason), newest first: op, reason, count, locations (by frequency)."""
    with _lock:
        rows = sorted(_fallbacks.values(), key=lambda r: -r["last_seq"])
        return [{"op": r["op"], "reason": r["reason"], "count": r["count"],
                 "locations": sorted(r["locations"], key=lambda k: -r["locations"][k]),
                 "source": dict(r["source"]), "first_seen": r["first_seen"],
                 "last_seen": r["last_seen"], "seq": r["last_seq"]} for r in rows]


def counters() -> dict[str, Any]:
    """A snapshot; safe from any thread (telemetry pushes from its own): ``record_fallback``
    mutates ``_fallbacks`` under ``_lock``, and summing it in a generator without the lock raised
    "dictionary changed size during iteration" in the pusher thread."""
    with _lock:
        fallbacks = sum(r["count"] for r in _fallbacks.values())
        coll = dict(_collective)
    _drain()
    return {"ops": sum(executed.values()), "distinct_ops": len(executed),
            "fallbacks": fallbacks,
            "syncs": dict(_syncs), "sync_total": sum(_syncs.values()), **_transfer, **coll}


def clear_op_tracking() -> None:
    with _lock:
        _drain()
        executed.clear()
        _fallbacks.clear()
        _syncs.clear()
        _warned.clear()
        for k in _transfer:
            _transfer[k] = 0
        for k in _collective:
            _collective[k] = 0
        _collective_ops.clear()
