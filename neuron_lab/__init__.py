"""neuron_lab: PyTorch on an (emulated) AWS Trainium ``neuron`` device, Jupyter first.

``import neuron_lab`` registers the ``neuron`` device (idempotent); so does ``import torch`` alone,
through the ``torch.backends`` entry point (``_autoload``). Layers, each importing only
the ones above it: ``device`` -> ``runtime`` -> ``compile``/``distributed`` -> ``telemetry`` ->
``jupyter`` (docs/design.md, "Layers"); this module is the façade that re-exports the public
names listed in its ``__all__``.
"""
from __future__ import annotations

__version__ = "0.1.0"
_ready = False


def _autoload() -> None:
    """The ``torch.backends`` entry point (pyproject.toml): PyTorch calls it at the end of
    ``import torch``, so ``device="neuron"`` works in a process that never imports neuron_lab,
    as for other out-of-tree backends; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` makes PyTorch skip it.
    Defined before anything imports torch: when ``import neuron_lab`` comes first, its own
    ``import torch`` calls this on the half-imported package, and the rest of this file
    registers the device."""
    if _ready:
        _register()


import gc as _gc  # noqa: E402

from .device import register as _register  # noqa: E402

# Registration makes a hundred thousand objects (a kernel and its facts per ATen op) that live as
# long as the process: the cycle collector's passes over them at import would find nothing.
_collecting = _gc.isenabled()
_gc.disable()
try:
    _register()
finally:
    if _collecting:
        _gc.enable()

from .device import config as _config  # noqa: E402
from .device.custom_kernels import kernel  # noqa: E402
from .device.tracking import clear_op_tracking, executed_ops, fallback_ops  # noqa: E402
from .runtime import get_mode, mode, set_mode, sync  # noqa: E402
from .runtime import install as _install_runtime  # noqa: E402

_install_runtime()   # the adaptive runtime the device calls (neuron_lab.runtime.current())
from .compile import install as _install_compile  # noqa: E402
from .distributed import register as _register_distributed  # noqa: E402

_install_compile()   # the "neuron" torch.compile backend (registered when dynamo is imported)
_register_distributed()   # the 'neuron' collective backend for torch.distributed
from .device import profiler as _profiler  # noqa: E402
# device events in torch.profiler (ProfilerActivity.PrivateUse1): a session's start hands the
# chip, the mode and the region launches to the telemetry layer, imported only then
_profiler.on_session_start("neuron_lab.telemetry.device_events")

_config.validate_environment()   # every NEURON_LAB_* knob is now defined: fail here, by name
_ready = True


def _load_library():
    import importlib
    return importlib.import_module(".library", __name__)


# The kernel library (``neuron_lab.library``) loads on first use, or as soon as Transformers is
# imported, which is where its attention and experts implementations register: importing it
# here would add its import time to every ``import torch``.
from .after_import import when_imported as _when_imported  # noqa: E402

def _load_library_for_transformers(_module) -> None:
    try:
        _load_library()
    except Exception as e:          # noqa: BLE001 - never break `import transformers`
        import warnings
        warnings.warn(f"neuron_lab: the kernel library did not load, so Transformers has no "
                      f"'neuron_attention' or 'neuron_moe': {e}", RuntimeWarning, stacklevel=2)


_when_imported("transformers", _load_library_for_transformers)


def __getattr__(name: str):
    if name == "library":
        return _load_library()
    raise AttributeError(f"module 'neuron_lab' has no attribute {name!r}")


def set_fallback(policy: str) -> None:
    """float64/complex policy: "host" (run on the host, record), "warn" (also warn once per op
    and location) or "error" (raise naming the op and the fix). Env: NEURON_LAB_FALLBACK."""
    _config.FALLBACK.set(policy)


def get_fallback() -> str:
    return _config.FALLBACK.get()


def metrics() -> dict:
    """JSON-safe snapshot: counters, regions, memory, cells."""
    from .telemetry import metrics as _metrics
    return _metrics()


def metrics_report() -> str:
    """Human-readable report (like torch_xla's metrics_report())."""
    from .telemetry import metrics_report as _report
    return _report()


def set_chip(chip: str) -> None:
    """Choose the modelled Trainium chip, "trn2" or "trn3", before the device is first used
    (env: NEURON_LAB_CHIP). Device properties, HBM capacity, the cost model and the panel
    follow it; a different chip after first use raises, naming the fix."""
    from .device.chips import set_chip as _set_chip
    _set_chip(chip)


def get_chip() -> str:
    """The modelled chip this process runs as ("trn2" or "trn3")."""
    from .device.chips import current as _current
    return _current().key


def cost_model(chip: str | None = None):
    """The modelled Trainium chip ("trn2" or "trn3"): ``.params`` (HBM bytes and bandwidth,
    peak FLOP/s per dtype, per-launch overhead, collective latency, their sources and which are
    assumptions) and ``launch_s(cost)``, the roofline. A model, not a measurement."""
    from .telemetry.cost_model import cost_model as _cost_model
    return _cost_model(chip)


def estimate(fn, *args, chip: str | None = None, **kwargs) -> dict:
    """Run ``fn(*args)`` once in eager and once in adaptive mode; per mode: launches,
    modelled_s (on ``chip``), host_s, bytes, flops. Would adaptive eager help on Trainium?"""
    from .telemetry.estimate import estimate as _estimate
    return _estimate(fn, *args, chip=chip, **kwargs)


def advise(chip: str | None = None) -> list[dict]:
    """Ranked bottlenecks from what was recorded: [{kind, where, message, fix, modelled_s,
    count}] (host syncs in loops, hot fallbacks, regions that never fuse, recompiles, memory
    near capacity, host-bound cells), costed on the modelled ``chip``."""
    from .telemetry.advise import advise as _advise
    return _advise(chip)


def profile(*args, **kwargs):
    """Context manager: torch.profiler with launch/compile ranges; exports a Chrome trace."""
    from .telemetry import profile as _profile
    return _profile(*args, **kwargs)


def dashboard(*args, **kwargs):
    """ipywidgets dashboard (memory, cells, fallbacks, regions) that updates live."""
    from .jupyter.dashboard import dashboard as _dashboard
    return _dashboard(*args, **kwargs)


def load_ipython_extension(ipython) -> None:
    from .jupyter.extension import load_ipython_extension as _load
    _load(ipython)


def unload_ipython_extension(ipython) -> None:
    from .jupyter.extension import unload_ipython_extension as _unload
    _unload(ipython)


__all__ = ["kernel", "set_mode", "get_mode", "mode", "sync", "executed_ops", "fallback_ops",
           "clear_op_tracking", "metrics", "metrics_report", "set_fallback", "get_fallback",
           "set_chip", "get_chip",
           "profile", "cost_model", "estimate", "advise", "dashboard", "load_ipython_extension",
           "unload_ipython_extension"]
