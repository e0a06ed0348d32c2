"""Runtime knobs: every one is a settable value / environment-variable pair.

A knob reads, in order: the value set in-process (``knob.set`` or ``with knob.scoped(v)``), then
the environment variable, then its default. Tests flip knobs with ``scoped`` (tinygrad's
``Context(...)`` idiom) without leaking into other tests; scripts set the environment
(``NEURON_LAB_MODE=eager python train.py``).

Why not ``contextvars``: PyTorch's autograd engine runs the backward pass of a non-CPU device
on its own device thread, which does not inherit the caller's context, so a ContextVar-scoped
``with neuron_lab.mode("eager"):`` would not reach the backward ops. The value is process-wide;
``scoped`` restores the previous value on exit.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")

_UNSET = object()


class Knob(Generic[T]):
    def __init__(self, env: str, default: T, parse: Callable[[str], T] = str, *,
                 choices: tuple | None = None, doc: str = "") -> None:
        self.env, self.default, self.parse, self.choices, self.doc = env, default, parse, choices, doc
        self._value: Any = _UNSET
        self._env_value: Any = _UNSET

    def _validate(self, value: Any) -> T:
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{self.env}: {value!r} is not one of {', '.join(map(repr, self.choices))}")
        return value

    def get(self) -> T:
        v = self._value
        if v is not _UNSET:
            return v
        v = self._env_value
        if v is _UNSET:
            v = self._env_value = self._read_env()
        return v

    def _read_env(self) -> T:
        raw = os.environ.get(self.env)
        if raw is None or raw == "":
            return self.default
        return self._validate(self.parse(raw))

    def refresh(self) -> None:
        """Re-read the environment variable (it is read once, on first use, for speed)."""
        self._env_value = _UNSET

    def set(self, value: T) -> None:
        self._value = self._validate(value)

    def reset(self) -> None:
        """Forget any value set in-process (back to environment/default)."""
        self._value = _UNSET

    @contextlib.contextmanager
    def scoped(self, value: T) -> Iterator[T]:
        old, self._value = self._value, self._validate(value)
        try:
            yield value
        finally:
            self._value = old

    def __repr__(self) -> str:
        return f"Knob({self.env}={self.get()!r})"


def _bool(s: str) -> bool:
    return s.strip().lower() in ("1", "true", "yes", "on")


FALLBACK = Knob("NEURON_LAB_FALLBACK", "host", str, choices=("host", "warn", "error"),
                doc="float64/complex policy: run on the host and record, also warn, or raise")
EXECUTOR = Knob("NEURON_LAB_EXECUTOR", "cpu", str, choices=("cpu", "cuda"),
                doc="host executor that holds the emulated device's data")
HBM_GB = Knob("NEURON_LAB_HBM_GB", 0.0, float,
              doc="modelled HBM capacity in GiB (0 = default: min(96, half of host RAM))")
DEBUG = Knob("NEURON_LAB_DEBUG", 0, int, doc="1: one line per region cache hit/miss/compile on stderr")
boolean = _bool
