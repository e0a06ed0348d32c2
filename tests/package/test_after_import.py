"""``neuron_lab.after_import.when_imported``: the callback runs once, after the module's code has
run to its end, in each way a module can be met: loaded already, loaded later, probed with
``importlib.util.find_spec`` before it is loaded, and caught mid-import (an import cycle)."""
import importlib
import importlib.util
import inspect
import sys
import textwrap

import pytest

from neuron_lab import after_import
from neuron_lab.after_import import when_imported


@pytest.fixture
def pkgdir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    made = []

    def write(name: str, code: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(code))
        made.append(name)
        return name
    yield write
    for name in made:
        sys.modules.pop(name, None)
    importlib.invalidate_caches()


def _waits(name: str) -> bool:
    f = after_import._finder
    return name in f.waiting or name in f.unfinished


def test_a_module_imported_later_runs_the_callbacks_after_its_code(pkgdir):
    name = pkgdir("nl_after_later", "FIRST = 1\nLAST = 2\n")
    seen = []
    when_imported(name, lambda m: seen.append(("a", m.LAST)))
    when_imported(name, lambda m: seen.append(("b", m.LAST)))
    assert seen == [] and _waits(name)
    mod = importlib.import_module(name)
    assert seen == [("a", 2), ("b", 2)]           # in order, the whole module ran first
    assert type(mod.__loader__).__name__ != "_Loader"      # the module keeps its own loader
    assert "LAST = 2" in inspect.getsource(mod)
    assert not _waits(name)
    importlib.reload(mod)
    assert len(seen) == 2                          # once


def test_a_module_loaded_already_runs_the_callback_now(pkgdir):
    name = pkgdir("nl_after_loaded", "X = 3\n")
    importlib.import_module(name)
    seen = []
    when_imported(name, lambda m: seen.append(m.X))
    assert seen == [3] and not _waits(name)


def test_a_find_spec_probe_before_the_import_takes_nothing(pkgdir):
    name = pkgdir("nl_after_probed", "X = 4\n")
    seen = []
    when_imported(name, lambda m: seen.append(m.X))
    assert importlib.util.find_spec(name) is not None     # "is it installed?": never loaded
    assert seen == [] and _waits(name)
    importlib.import_module(name)
    assert seen == [4] and not _waits(name)


def test_a_module_caught_mid_import_gets_the_callback_once_it_has_finished(pkgdir):
    seen = []
    pkgdir("nl_after_other", "Y = 1\n")
    pkgdir("nl_after_hooker", """
        from neuron_lab.after_import import when_imported
        import nl_after_cycle_seen
        when_imported("nl_after_cycle", lambda m: nl_after_cycle_seen.append(getattr(m, "DONE", None)))
    """)
    sys.modules["nl_after_cycle_seen"] = seen
    name = pkgdir("nl_after_cycle", """
        import nl_after_hooker      # registers while this module is still running
        DONE = True
    """)
    try:
        importlib.import_module(name)
        assert seen == [] and _waits(name)      # not while half-run, nor lost
        importlib.import_module("nl_after_other")   # the next import after it finished
        assert seen == [True] and not _waits(name)
    finally:
        sys.modules.pop("nl_after_cycle_seen", None)


def test_the_hook_leaves_sys_meta_path_when_nothing_waits(pkgdir, monkeypatch):
    mine = after_import._Finder()
    monkeypatch.setattr(after_import, "_finder", mine)
    name = pkgdir("nl_after_alone", "X = 5\n")
    seen = []
    when_imported(name, lambda m: seen.append(m.X))
    assert mine in sys.meta_path
    importlib.import_module(name)
    assert seen == [5] and mine not in sys.meta_path
