"""Admission: an op's new device bytes, known from its arguments, checked before the host allocates.

The modelled HBM capacity must be checked before anything is allocated (issue 15): checking after
the host kernel ran means ``torch.zeros`` of 3 GiB on a 1 GiB device first zero-fills 3 GiB of
host memory (1.4-2.1 s here), and a request larger than the host's RAM fails in the host
allocator instead of raising ``torch.OutOfMemoryError``.

What is predicted, from the schema's arguments alone (no shape inference on the hot path):
factories with a ``size`` (``empty``, ``zeros``, ``full``, ``rand*``, ``new_*``, ``empty_strided``,
``normal``), ``*_like``, ``arange``/``linspace``/``logspace``/``eye``/``randperm``, copies
(``clone``, ``_to_copy``, ``contiguous``), ``repeat`` and ``cat``. A transfer ``.to('neuron')``
allocates through ``empty``, so it is covered too. Every other op's output is allocated by the host
kernel and checked before the result is handed out (the host bytes are freed at once); in adaptive
mode a deferred op is checked from the region cache's recorded metadata before anything runs.
Any op whose host allocation fails is reported as ``torch.OutOfMemoryError`` (``host_oom``).
"""
from __future__ import annotations

import math
import re
from typing import Callable

import torch

Sizer = Callable[[tuple, dict], int]

_SIZE_FACTORIES = frozenset({"empty", "zeros", "ones", "full", "rand", "randn", "randint",
                             "new_empty", "new_zeros", "new_ones", "new_full", "empty_strided",
                             "new_empty_strided", "normal", "empty_permuted"})
_COPIES = frozenset({"clone", "_to_copy"})

# Ops whose bytes the native direct kernel (device/csrc/direct.cpp) predicts itself, before the
# host allocates, as their sizers below do, so they run in eager mode without Python: 1, argument
# 0's numel times its element size (``clone``: ``.contiguous()``, ``reshape`` of a transposed
# tensor); 2, the sum of argument 0's tensors' numels times their largest element size (``cat``).
DIRECT_SIZED = {"clone": 1, "cat": 2}


def _getter(schema, name: str):
    """A function reading argument ``name`` from (args, kwargs) as the dispatcher passes them."""
    for i, a in enumerate(schema.arguments):
        if a.name == name:
            default = a.default_value if a.has_default_value() else None
            if a.kwarg_only:
                return lambda args, kwargs: kwargs.get(name, default)
            return lambda args, kwargs: args[i] if i < len(args) else kwargs.get(name, default)
    return None


def _numel(size) -> int:
    return math.prod(int(s) for s in size)


def _itemsize(dtype, fallback: torch.dtype) -> int:
    return (dtype if isinstance(dtype, torch.dtype) else fallback).itemsize


def _fill_dtype(value) -> torch.dtype:
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    if isinstance(value, complex):
        return torch.complex64 if torch.get_default_dtype() == torch.float32 else torch.complex128
    return torch.get_default_dtype()


# every op name ``sizer`` knows (with the ``*_like`` factories)
_SIZED = frozenset(_SIZE_FACTORIES) | frozenset(_COPIES) | {
    "arange", "linspace", "logspace", "eye", "randperm", "repeat", "cat"}


def sizer(op: torch._ops.OpOverload) -> Sizer | None:
    """The bytes ``op`` will allocate for its output, from its arguments; None if unknown."""
    schema = op._schema
    base = schema.name.split("::", 1)[1]
    if not (base in _SIZED or base.endswith("_like")):
        return None         # the common case, decided before reading the schema's arguments
    names = {a.name for a in schema.arguments}
    dtype_of = _getter(schema, "dtype") if "dtype" in names else (lambda a, k: None)
    if base in _SIZE_FACTORIES and "size" in names:
        size = _getter(schema, "size")
        self_ = _getter(schema, "self") if "self" in names else None
        stride = _getter(schema, "stride") if "stride" in names else None
        fill = _getter(schema, "fill_value") if "fill_value" in names else None

        def factory(args, kwargs):
            dt = dtype_of(args, kwargs)
            if dt is None:
                dt = (self_(args, kwargs).dtype if self_ is not None
                      else _fill_dtype(fill(args, kwargs)) if fill is not None
                      else torch.int64 if base == "randint" else torch.get_default_dtype())
            sz = size(args, kwargs)
            if stride is not None and _numel(sz):
                span = 1 + sum((int(n) - 1) * int(s) for n, s in zip(sz, stride(args, kwargs)))
            else:
                span = _numel(sz)
            return span * _itemsize(dt, dt)
        return factory
    if base.endswith("_like") and "self" in names:
        self_ = _getter(schema, "self")
        return lambda args, kwargs: (lambda t: t.numel() * _itemsize(dtype_of(args, kwargs),
                                                                       t.dtype))(self_(args, kwargs))
    if base in _COPIES:
        self_ = _getter(schema, "self")
        dev = _getter(schema, "device") if "device" in names else (lambda a, k: None)

        def copy(args, kwargs):
            d = dev(args, kwargs)
            if d is not None and torch.device(d).type != "neuron":
                return 0                    # a device -> host copy holds no device memory
            t = self_(args, kwargs)
            return t.numel() * _itemsize(dtype_of(args, kwargs), t.dtype)
        return copy
    if base == "arange":
        start = _getter(schema, "start") if "start" in names else (lambda a, k: 0)
        end, step = _getter(schema, "end"), (_getter(schema, "step") if "step" in names
                                             else (lambda a, k: 1))

        def arange(args, kwargs):
            s, e, st = start(args, kwargs), end(args, kwargs), step(args, kwargs)
            vals = [v.item() if isinstance(v, torch.Tensor) else v for v in (s, e, st)]
            dt = dtype_of(args, kwargs) or (torch.int64 if all(isinstance(v, int) for v in vals)
                                            else torch.get_default_dtype())
            n = max(0, math.ceil((vals[1] - vals[0]) / vals[2])) if vals[2] else 0
            return n * _itemsize(dt, dt)
        return arange
    if base in ("linspace", "logspace") and "steps" in names:
        steps = _getter(schema, "steps")
        return lambda args, kwargs: int(steps(args, kwargs)) * _itemsize(
            dtype_of(args, kwargs), torch.get_default_dtype())
    if base == "eye":
        n = _getter(schema, "n")
        m = _getter(schema, "m") if "m" in names else n
        return lambda args, kwargs: int(n(args, kwargs)) * int(m(args, kwargs)) * _itemsize(
            dtype_of(args, kwargs), torch.get_default_dtype())
    if base == "randperm":
        n = _getter(schema, "n")
        return lambda args, kwargs: int(n(args, kwargs)) * _itemsize(dtype_of(args, kwargs),
                                                                      torch.int64)
    if base == "repeat":
        self_, reps = _getter(schema, "self"), _getter(schema, "repeats")
        return lambda args, kwargs: (lambda t: t.numel() * _numel(reps(args, kwargs))
                                     * t.element_size())(self_(args, kwargs))
    if base == "cat" and "tensors" in names:
        ts = _getter(schema, "tensors")
        return lambda args, kwargs: (lambda seq: sum(t.numel() for t in seq)
                                     * max((t.element_size() for t in seq), default=0))(
            ts(args, kwargs))
    return None


_HOST_FAILURE = re.compile(r"can't allocate memory: you tried to allocate (\d+) bytes|"
                           r"not enough memory: you tried to allocate (\d+) bytes")


def host_oom(err: BaseException, op: str, capacity: int, allocated: int):
    """The ``torch.OutOfMemoryError`` for a host allocation that failed inside ``op``, or None if
    ``err`` is not one (a request larger than the host's RAM, with a modelled capacity above it)."""
    if isinstance(err, torch.OutOfMemoryError):
        return None
    m = _HOST_FAILURE.search(str(err))
    if m is None:
        return None
    n = int(m.group(1) or m.group(2))
    return torch.OutOfMemoryError(
        f"neuron: out of memory on device neuron:0 in {op}: tried to allocate {n} bytes with "
        f"{allocated} bytes allocated of {capacity} bytes modelled HBM capacity, and the host "
        f"executor holding the emulated device's memory could not allocate it either (the host "
        f"has less RAM than NEURON_LAB_HBM_GB models). Lower NEURON_LAB_HBM_GB to what the host "
        f"can hold, or free tensors you no longer need. Every existing tensor is unchanged.")
