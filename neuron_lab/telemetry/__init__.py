"""Layer 3, telemetry: counters, launch/compile records, memory samples, per-cell records.

``store`` (subscribed to the device/runtime event bus), ``cells`` (per-cell records),
``sampler`` (background memory sampling while a cell runs), ``watch`` (change detection while
idle), ``metrics()`` / ``metrics_report()`` (snapshot and text), ``profile()`` (torch.profiler
and the exporters in ``export``), ``cost_model()`` / ``estimate()`` (the modelled Trainium,
``costing`` prices recorded launches), ``enable_all()``/``disable_all()`` (everything on/off).
"""
from .advise import advise
from .cells import cells
from .cost_model import cost_model
from .estimate import estimate
from .export import export_chrome_trace, export_table, read_table
from .profile import profile
from .overview import metrics, metrics_report
from .sampler import Sampler
from .store import store
from .switch import disable_all, enable_all, enabled
from .watch import ChangeWatcher

__all__ = ["metrics", "metrics_report", "profile", "cost_model", "estimate", "advise", "export_table", "read_table",
           "export_chrome_trace", "store", "cells", "Sampler",
           "ChangeWatcher", "enable_all", "disable_all", "enabled"]
