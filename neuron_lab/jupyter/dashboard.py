"""``neuron_lab.dashboard()``: the side panel's content as ipywidgets, for frontends without the
JupyterLab extension (Notebook 7, VS Code). It follows the same sampler as the comm: while a
cell runs (with ``%load_ext neuron_lab``) it refreshes at the push rate from a background thread.
"""
from __future__ import annotations

import io

from .. import runtime
from ..device import memory
from ..telemetry import metrics, store
from ..telemetry.report import _fmt_bytes
from .magics import fallback_table, region_table
from .views import Table


class Dashboard:
    def __init__(self) -> None:
        import ipywidgets as W
        self.W = W
        self.gauge = W.FloatProgress(min=0.0, max=1.0, description="HBM", bar_style="info")
        self.gauge_label = W.HTML()
        self.timeline = W.Image(format="png")
        self.cells = W.HTML()
        self.fallbacks = W.HTML()
        self.regions = W.HTML()
        self.widget = W.VBox([W.HTML("<b>neuron:0</b>"), W.HBox([self.gauge, self.gauge_label]),
                              self.timeline, W.HTML("<b>Cells</b>"), self.cells,
                              W.HTML("<b>Fallbacks</b>"), self.fallbacks,
                              W.HTML("<b>Regions</b>"), self.regions])
        self.refresh()

    def _plot(self, m: dict) -> bytes:
        import matplotlib
        matplotlib.use("Agg", force=False)
        from matplotlib.figure import Figure
        fig = Figure(figsize=(6, 2.6), dpi=80)
        ax1, ax2 = fig.subplots(1, 2)
        tl = m["memory"]["timeline"]
        ax1.plot([t for t, _ in tl], [a / 2**20 for _, a in tl] or [], color="tab:blue")
        ax1.set_title("allocated (MiB)", fontsize=9)
        cells = m["cells"][-12:]
        ax2.bar(range(len(cells)), [c["wall_s"] for c in cells], color="tab:gray", label="wall")
        ax2.bar(range(len(cells)), [c["device_s"] for c in cells], color="tab:orange", label="device")
        ax2.set_title("last cells (s)", fontsize=9)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()

    def refresh(self, _sample=None) -> None:
        m = metrics()
        mem = m["memory"]
        self.gauge.value = mem["allocated"] / mem["capacity"] if mem["capacity"] else 0.0
        self.gauge_label.value = (f"{_fmt_bytes(mem['allocated'])} allocated, "
                                  f"{_fmt_bytes(mem['peak'])} peak, "
                                  f"{_fmt_bytes(mem['reserved'])} reserved of "
                                  f"{_fmt_bytes(mem['capacity'])}")
        self.timeline.value = self._plot(m)
        self.cells.value = Table("", m["cells"][-10:], ["index", "wall_s", "device_s", "ops",
                                                         "launches", "fused_share", "fallbacks",
                                                         "peak_bytes"])._repr_html_()
        self.fallbacks.value = fallback_table()._repr_html_()
        self.regions.value = region_table()._repr_html_()

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget)


def dashboard() -> Dashboard:
    """Show the live dashboard; it refreshes while cells run when the extension is loaded."""
    from .extension import _state
    d = Dashboard()
    sampler = _state.get("sampler")
    if sampler is not None:
        sampler.listeners.append(d.refresh)
    return d
