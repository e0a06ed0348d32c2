"""Runtime knobs: every one is a settable value / environment-variable pair.

A knob reads, in order: the value set in-process (``knob.set`` or ``with knob.scoped(v)``), then
the environment variable, then its default. ``import neuron_lab`` validates every knob's variable
(``validate_environment``): a bad value fails there with the variable's name and allowed values. Tests flip knobs with ``scoped`` (tinygrad's
``Context(...)`` idiom) without leaking into other tests; scripts set the environment
(``NEURON_LAB_MODE=eager python train.py``).

Why not ``contextvars``: PyTorch's autograd engine runs the backward pass of a non-CPU device
on its own device thread, which does not inherit the caller's context, so a ContextVar-scoped
``with neuron_lab.mode("eager"):`` would not reach the backward ops. The value is process-wide;
``scoped`` restores the previous value on exit.
"""
from __future__ import annotations

import contextlib
import difflib
import math
import os
import warnings
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")

_UNSET = object()
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

# Every knob, by variable name: ``validate_environment`` checks them all at import.
KNOBS: dict[str, "Knob"] = {}
# NEURON_LAB_* variables read by the repo's scripts (scripts/setup.sh), not by the package.
SCRIPT_VARIABLES = frozenset({"NEURON_LAB_VENV", "NEURON_LAB_TORCH", "NEURON_LAB_SKIP_BROWSER"})


class ConfigError(ValueError):
    """A ``NEURON_LAB_*`` setting outside its allowed values (the message names both)."""


class Knob(Generic[T]):
    """``minimum`` bounds numeric knobs (default 0: no knob here means anything negative)."""

    def __init__(self, env: str, default: T, parse: Callable[[str], T] = str, *,
                 choices: tuple | None = None, minimum: float | None = None,
                 doc: str = "") -> None:
        self.env, self.default, self.parse, self.choices, self.doc = env, default, parse, choices, doc
        if minimum is None and parse in (int, float):
            minimum = 0
        self.minimum = minimum
        self._value: Any = _UNSET
        self._env_value: Any = _UNSET
        self._watchers: list[Callable[[], None]] = []
        KNOBS[env] = self

    def watch(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` after every change of this knob's value (set, reset, scoped, refresh):
        for state kept outside Python that follows a knob (the native kernels'). ``fn`` must
        not raise: a bad variable is reported where the knob is read, not in a watcher."""
        self._watchers.append(fn)

    def _changed(self) -> None:
        for fn in self._watchers:
            fn()

    def allowed(self) -> str:
        """The allowed values, in words (for error messages and docs)."""
        if self.choices is not None:
            return "one of " + ", ".join(map(repr, self.choices))
        if self.parse is _bool:
            return "a boolean: one of " + ", ".join(_TRUE + _FALSE)
        kind = {int: "an integer", float: "a number"}.get(self.parse, "a string")
        return kind if self.minimum is None else f"{kind} >= {self.minimum:g}"

    def _error(self, value: Any) -> ConfigError:
        return ConfigError(f"{self.env}={value!r} is not valid: expected {self.allowed()} "
                           f"(default {self.default!r}; {self.doc})")

    def _validate(self, value: Any) -> T:
        if self.choices is not None and value not in self.choices:
            raise self._error(value)
        if self.minimum is not None and (not isinstance(value, (int, float))
                                         or isinstance(value, bool) or value < self.minimum
                                         or not math.isfinite(value)):
            raise self._error(value)
        return value

    def get(self) -> T:
        v = self._value
        if v is _UNSET:
            v = self._env_value          # env_value's cache, read here: get is on hot paths
            if v is _UNSET:
                v = self.env_value()
        return v

    def env_value(self) -> T:
        """The environment variable's value (or the default), ignoring any in-process setting."""
        v = self._env_value
        if v is _UNSET:
            v = self._env_value = self._read_env()
        return v

    def _read_env(self) -> T:
        raw = os.environ.get(self.env)
        if raw is None or raw == "":
            return self.default
        try:
            return self._validate(self.parse(raw.strip()))
        except ValueError:       # ConfigError is one too: report the raw text the user wrote
            raise self._error(raw) from None

    def refresh(self) -> None:
        """Re-read the environment variable (it is read once, on first use, for speed)."""
        self._env_value = _UNSET
        self._changed()

    def set(self, value: T) -> None:
        self._value = self._validate(value)
        self._changed()

    def reset(self) -> None:
        """Forget any value set in-process (back to environment/default)."""
        self._value = _UNSET
        self._changed()

    @contextlib.contextmanager
    def scoped(self, value: T) -> Iterator[T]:
        old, self._value = self._value, self._validate(value)
        self._changed()
        try:
            yield value
        finally:
            self._value = old
            self._changed()

    def __repr__(self) -> str:
        return f"Knob({self.env}={self.get()!r})"


def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(s)


def validate_environment() -> None:
    """Read every knob's variable now (``import neuron_lab`` calls this): a bad value raises
    ``ConfigError`` naming the variable and its allowed values at import, not at the first op
    that reads it. An unknown ``NEURON_LAB_*`` name (a typo) warns with the closest known one."""
    for knob in list(KNOBS.values()):       # the variable, even where a value is set in-process
        knob.refresh()
        knob.env_value()
    for name in os.environ:
        if name.startswith("NEURON_LAB_") and name not in KNOBS and name not in SCRIPT_VARIABLES:
            close = difflib.get_close_matches(name, list(KNOBS), n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            warnings.warn(f"{name} is not a neuron_lab setting and is ignored; {hint}"
                          f"known: {', '.join(sorted(KNOBS))}", RuntimeWarning, stacklevel=2)


FALLBACK = Knob("NEURON_LAB_FALLBACK", "host", str, choices=("host", "warn", "error"),
                doc="float64/complex policy: run on the host and record, also warn, or raise")
EXECUTOR = Knob("NEURON_LAB_EXECUTOR", "cpu", str, choices=("cpu", "cuda"),
                doc="host executor that holds the emulated device's data")
HBM_GB = Knob("NEURON_LAB_HBM_GB", 0.0, float,
              doc="modelled HBM capacity in GiB (0 = default: min(the chip's HBM, half of "
                  "host RAM))")
CHIP = Knob("NEURON_LAB_CHIP", "trn2", str, choices=("trn2", "trn3"),
            doc="the modelled Trainium chip (chips.py): device properties, HBM capacity, cost "
                "model and panel follow it; chosen once, before the device is first used")
DIRECT = Knob("NEURON_LAB_DIRECT", True, _bool,
              doc="run plain ops, views and pointwise in-place ops in eager mode in C++ without "
                  "entering Python (csrc/direct.cpp; read at import); 0: every op through the "
                  "Python kernel")
DEBUG = Knob("NEURON_LAB_DEBUG", 0, int, doc="1: one line per region cache hit/miss/compile on stderr")
boolean = _bool
