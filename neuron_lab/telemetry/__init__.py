"""Layer 3, telemetry: counters, launch/compile records, memory samples, per-cell records.

``store`` (subscribed to the device/runtime event bus), ``cells`` (per-cell records),
``sampler`` (background memory sampling while a cell runs), ``metrics()`` /
``metrics_report()`` (snapshot and text), ``profile()`` (torch.profiler + exports).
"""
from .cells import cells
from .profile import export_table, profile
from .report import metrics, metrics_report
from .sampler import Sampler
from .store import store

__all__ = ["metrics", "metrics_report", "profile", "export_table", "store", "cells", "Sampler"]
