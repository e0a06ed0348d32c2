"""``when_imported(name, fn)``: call ``fn(module)`` once module ``name`` has been imported.

A leaf every layer may import. The package loads ``neuron_lab.library`` when Transformers is
imported (so ``attn_implementation="neuron_attention"`` works without importing the library),
and the library connects to Transformers' registries and to the cost model without importing
either itself (both are heavy, and the cost model lives in a layer that must not import the
library): if the module is loaded already, ``fn`` runs now; otherwise an import hook runs it
right after the module's code has executed, and then removes itself.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from typing import Callable


class _After(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, name: str) -> None:
        self.name, self.callbacks, self._loader = name, [], None

    def find_spec(self, name, path, target=None):
        if name != self.name or self._loader is not None:
            return None
        sys.meta_path.remove(self)                 # find the real spec, then wrap its loader
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for fn in self.callbacks:
            fn(module)


def when_imported(name: str, fn: Callable) -> None:
    mod = sys.modules.get(name)
    if mod is not None:
        fn(mod)
        return
    hook = next((f for f in sys.meta_path if isinstance(f, _After) and f.name == name), None)
    if hook is None:
        hook = _After(name)
        sys.meta_path.insert(0, hook)
    hook.callbacks.append(fn)
