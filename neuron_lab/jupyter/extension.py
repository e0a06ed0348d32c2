"""``%load_ext neuron_lab``: magics, per-cell hooks, the comm target, the sampler, the watcher.

Two background threads feed the live views: the ``Sampler`` at the push rate while a cell runs
(started by ``pre_run_cell``, stopped by ``post_run_cell``) and the ``ChangeWatcher`` at 1 Hz
while idle (paused during cells). Load and unload are symmetric: unload removes the hooks, the
magics and the comm target and stops both threads. A second ``%load_ext`` is a no-op. To load
it in every kernel, add to ``ipython_config.py`` (profile_default):
``c.InteractiveShellApp.extensions = ["neuron_lab"]``.

Loading opens a comm from the kernel (see ``comm.py``), so the panel is live from the cell that
loads it. Loaded from inside a cell, the rest of that cell is recorded and sampled as a cell of
its own (IPython calls ``post_run_cell`` callbacks registered during the cell): a first cell
``%load_ext neuron_lab`` followed by a long loop shows live in the panel, as does the next cell.
"""
from __future__ import annotations

import warnings

import IPython

from ..telemetry import cells, store
from ..telemetry.sampler import Sampler
from ..telemetry.watch import ChangeWatcher
from .comm import Endpoint
from .magics import NeuronMagics

_state: dict = {}
_IPY_MAJOR = int(IPython.__version__.split(".")[0])


def _cell_number(shell, info) -> int | None:
    """The N of ``In[N]`` this cell runs as (its code is compiled under that number, so its
    locations read ``Cell In[N], line M``). IPython 9 counts a history-storing cell before
    ``pre_run_cell``, IPython 8 after it; ``post_run_cell`` then confirms it from the result."""
    n = getattr(shell, "execution_count", None)
    if n is None:
        return None
    counted_first = _IPY_MAJOR >= 9 and getattr(info, "store_history", False)
    return n - 1 if counted_first else n


def _pre_run_cell(info) -> None:
    if cells.running:           # a nested run_cell (``%%neuron_profile`` runs its body): one record
        _state["depth"] = _state.get("depth", 0) + 1
        return
    _state["watcher"].pause()
    cells.start(getattr(info, "cell_id", None), _cell_number(_state.get("ipython"), info))
    _state["sampler"].start()


def _post_run_cell(result) -> None:
    if _state.get("depth"):
        _state["depth"] -= 1
        return
    _state["sampler"].stop()
    try:
        record = cells.end(getattr(result, "execution_count", None))
    finally:
        _state["watcher"].resume()
    _state["endpoint"].cell_finished(record)
    for fn in list(_state["cell_listeners"]):     # dashboards
        try:
            fn(record)
        except Exception:
            pass
    if cells.last_error is not None:
        # the cell's queued work failed when it was flushed at cell end: IPython shows this
        # as an error in the post_run_cell callback; the record (with "error") is kept
        raise cells.last_error


def _running_cell(ipython):
    """The ``ExecutionInfo`` of the cell running now (IPython keeps its result on the
    displayhook while the cell's code runs), or None: loaded at kernel start by the config, or
    from a silent execution (which gets no ``post_run_cell``, so it must not start a record)."""
    result = getattr(getattr(ipython, "displayhook", None), "exec_result", None)
    info = getattr(result, "info", None)
    return None if info is None or getattr(info, "silent", False) else info


def load_ipython_extension(ipython) -> None:
    if _state:
        return
    store.start()               # subscribed at import; again here in case disable_all() ran
    sampler, watcher = Sampler(), ChangeWatcher()
    endpoint = Endpoint(sampler, watcher)
    try:
        endpoint.register()
    except Exception:           # no kernel (plain IPython terminal): no comm, magics still work
        pass
    ipython.register_magics(NeuronMagics)
    ipython.events.register("pre_run_cell", _pre_run_cell)
    ipython.events.register("post_run_cell", _post_run_cell)
    watcher.start()
    _state.update(sampler=sampler, watcher=watcher, endpoint=endpoint, ipython=ipython,
                  cell_listeners=[])
    if getattr(ipython, "kernel", None) is not None:    # a kernel (not a terminal): open it now
        try:
            endpoint.open_from_kernel()
        except Exception as e:           # the frontend-opened path still works
            warnings.warn(f"neuron_lab: could not open the panel's comm from the kernel: {e}",
                          RuntimeWarning, stacklevel=2)
    info = _running_cell(ipython)
    if info is not None:
        _pre_run_cell(info)


def unload_ipython_extension(ipython) -> None:
    if not _state:
        return
    ipython.events.unregister("pre_run_cell", _pre_run_cell)
    ipython.events.unregister("post_run_cell", _post_run_cell)
    _state["sampler"].stop()
    _state["watcher"].stop()
    _state["endpoint"].unregister()
    mm = ipython.magics_manager
    for kind in ("line", "cell"):
        for name in [n for n in mm.magics[kind] if n.startswith("neuron")]:
            del mm.magics[kind][name]
    _state.clear()
