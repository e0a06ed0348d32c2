"""``when_imported(name, fn)``: call ``fn(module)`` once module ``name`` has been imported.

A leaf every layer may import. The package loads ``neuron_lab.library`` when Transformers is
imported (so ``attn_implementation="neuron_attention"`` works without importing the library);
the library connects to Transformers' registries and to the cost model without importing
either; the compile layer registers the ``neuron`` backend with dynamo, and patches
FlexAttention, when those are imported (all heavy, and some in layers a caller must not import).

``fn(module)`` runs once, after the module's code has run to its end:

- the module is loaded already: ``fn`` runs now;
- it is not: an import hook (a ``sys.meta_path`` finder) wraps its loader, and ``fn`` runs right
  after the module's code, when the import that loads it returns;
- it is being imported right now (``when_imported`` was called from code that its import runs:
  an import cycle): ``fn`` runs at the first import of any module after it has finished, since
  nothing can hook the end of an import that already started, and a half-run module would be
  read before its names exist.

The hook removes itself once nothing waits. Callbacks for one module run in the order given.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable


class _Finder(importlib.abc.MetaPathFinder):
    """The one import hook: ``waiting`` holds the callbacks of modules not loaded yet;
    ``unfinished`` those of modules caught mid-import."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[Callable]] = {}
        self.unfinished: dict[str, list[Callable]] = {}
        self._finding: set[str] = set()

    def find_spec(self, name, path, target=None):
        if self.unfinished:
            self._run_finished()
        if name not in self.waiting or name in self._finding:
            return None
        self._finding.add(name)                 # find the real spec, then wrap its loader
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding.discard(name)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, self, name)   # a spec found but never loaded
        return spec                                       # (find_spec probes) takes nothing

    def take(self, name: str) -> list[Callable]:
        """The callbacks waiting for ``name``, which has just been loaded."""
        callbacks = self.waiting.pop(name, [])
        self._remove_if_idle()
        return callbacks

    def _run_finished(self) -> None:
        for name in [n for n in self.unfinished if not _initializing(sys.modules.get(n))]:
            callbacks = self.unfinished.pop(name)
            module = sys.modules.get(name)
            if module is not None:
                for fn in callbacks:
                    fn(module)
        self._remove_if_idle()

    def _remove_if_idle(self) -> None:
        if not self.waiting and not self.unfinished and self in sys.meta_path:
            sys.meta_path.remove(self)

    def add(self, table: dict, name: str, fn: Callable) -> None:
        table.setdefault(name, []).append(fn)
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the callbacks waiting for it."""

    def __init__(self, loader, finder: _Finder, name: str) -> None:
        self._loader, self._finder, self._name = loader, finder, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def __getattr__(self, name):            # get_source, is_package, get_resource_reader...
        return getattr(self._loader, name)

    def exec_module(self, module):
        try:
            self._loader.exec_module(module)
        finally:                            # the module keeps its own loader, not this one
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader
        for fn in self._finder.take(self._name):
            fn(module)


def _initializing(module) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(spec is not None and getattr(spec, "_initializing", False))


_finder = _Finder()


def when_imported(name: str, fn: Callable) -> None:
    """``fn(module)`` once module ``name`` is imported: now if it is (see the module's doc)."""
    module = sys.modules.get(name)
    if module is None:
        _finder.add(_finder.waiting, name, fn)
    elif _initializing(module):
        _finder.add(_finder.unfinished, name, fn)
    else:
        fn(module)
