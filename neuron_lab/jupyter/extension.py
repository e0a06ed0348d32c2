"""``%load_ext neuron_lab``: magics, per-cell hooks, the comm target, the sampler.

Load and unload are symmetric: unload removes the hooks, the comm target and stops the
sampler. To load it in every kernel, add to ``ipython_config.py`` (profile_default):
``c.InteractiveShellApp.extensions = ["neuron_lab"]``.
"""
from __future__ import annotations

from ..telemetry import cells
from ..telemetry.sampler import Sampler
from .comm import Endpoint
from .magics import NeuronMagics

_state: dict = {}


def _pre_run_cell(info) -> None:
    if cells.running:           # a nested run_cell (``%%neuron_profile`` runs its body): one record
        _state["depth"] = _state.get("depth", 0) + 1
        return
    cells.start(getattr(info, "cell_id", None))
    _state["sampler"].start()


def _post_run_cell(result) -> None:
    if _state.get("depth"):
        _state["depth"] -= 1
        return
    sampler = _state["sampler"]
    sampler.stop()
    try:
        record = cells.end()
    except Exception:  # the cell's own error is reported by IPython; keep the hooks alive
        record = None
    _state["endpoint"].cell_finished(record)


def load_ipython_extension(ipython) -> None:
    if _state:
        return
    sampler = Sampler()
    endpoint = Endpoint(sampler)
    try:
        endpoint.register()
    except Exception:           # no kernel (plain IPython terminal): no comm, magics still work
        pass
    ipython.register_magics(NeuronMagics)
    ipython.events.register("pre_run_cell", _pre_run_cell)
    ipython.events.register("post_run_cell", _post_run_cell)
    _state.update(sampler=sampler, endpoint=endpoint, ipython=ipython)


def unload_ipython_extension(ipython) -> None:
    if not _state:
        return
    ipython.events.unregister("pre_run_cell", _pre_run_cell)
    ipython.events.unregister("post_run_cell", _post_run_cell)
    _state["sampler"].stop()
    _state["endpoint"].unregister()
    mm = ipython.magics_manager
    for kind in ("line", "cell"):
        for name in [n for n in mm.magics[kind] if n.startswith("neuron")]:
            del mm.magics[kind][name]
    _state.clear()
