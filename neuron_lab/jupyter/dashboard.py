"""``neuron_lab.dashboard()``: the side panel's content as ipywidgets, for frontends without the
JupyterLab extension (Notebook 7, VS Code).

Two speeds, because a matplotlib raster costs 70-500 ms on a loaded 2-core machine and the
push rate is 4 Hz: the cheap parts (HBM gauge, a live SVG sparkline of the memory timeline,
the running cell's ops/launches, the fallback table) refresh on every sampler tick from the
sampler's thread while a cell runs, and on change while idle (the watcher); the matplotlib
figure (memory timeline + per-cell wall/device bars) is redrawn only when a cell finishes, on a
short-lived thread so the kernel is not held up. ``refresh()`` does both by hand.
``dashboard()`` loads the extension first when called in IPython, so it is live by default.
"""
from __future__ import annotations

import html
import io
import threading

from ..telemetry import cells as cell_tracker
from ..telemetry import metrics, store
from ..telemetry.overview import _fmt_bytes
from .magics import fallback_table, region_table
from .views import Table

CELL_COLUMNS = ["execution_count", "cell_id", "wall_s", "device_s", "modelled_s", "ops",
                "launches", "fused_share", "fallbacks", "peak_bytes"]


def sparkline(timeline: list, width: int = 320, height: int = 48) -> str:
    """An inline SVG polyline of ``[[t, allocated], ...]`` (no matplotlib: microseconds)."""
    if len(timeline) < 2:
        return f"<svg width='{width}' height='{height}'></svg>"
    t0, t1 = timeline[0][0], timeline[-1][0]
    top = max(a for _, a in timeline) or 1
    span = (t1 - t0) or 1
    pts = " ".join(f"{(t - t0) / span * (width - 2) + 1:.1f},{height - 1 - a / top * (height - 2):.1f}"
                   for t, a in timeline)
    return (f"<svg width='{width}' height='{height}'><polyline fill='none' stroke='#1f77b4' "
            f"stroke-width='1.5' points='{pts}'/><text x='2' y='10' font-size='9'>"
            f"{html.escape(_fmt_bytes(top))}</text></svg>")


class Dashboard:
    def __init__(self) -> None:
        import ipywidgets as W
        self.W = W
        self.gauge = W.FloatProgress(min=0.0, max=1.0, description="HBM", bar_style="info")
        self.gauge_label = W.HTML()
        self.spark = W.HTML()
        self.running = W.HTML()
        self.timeline = W.Image(format="png")
        self.cells = W.HTML()
        self.fallbacks = W.HTML()
        self.regions = W.HTML()
        self.widget = W.VBox([W.HTML("<b>neuron:0</b>"), W.HBox([self.gauge, self.gauge_label]),
                              self.spark, self.running, self.timeline, W.HTML("<b>Cells</b>"),
                              self.cells, W.HTML("<b>Fallbacks</b>"), self.fallbacks,
                              W.HTML("<b>Regions</b>"), self.regions])
        self._fig = None
        self._plot_lock = threading.Lock()
        self._fallback_seq = -1
        self.ticks = 0               # live refreshes so far (tests and curiosity)
        self._detach = []
        self.refresh()

    # --- the cheap part: every tick ---------------------------------------------------------
    def tick(self, _sample=None) -> None:
        from ..device import memory
        alloc, cap = memory.memory_allocated(), memory.capacity()
        self.gauge.value = min(1.0, alloc / cap) if cap else 0.0
        self.gauge_label.value = (f"{_fmt_bytes(alloc)} allocated, "
                                  f"{_fmt_bytes(memory.max_memory_allocated())} peak, "
                                  f"{_fmt_bytes(memory.memory_reserved())} reserved of "
                                  f"{_fmt_bytes(cap)}")
        with store.lock:
            tl = [[s["t"], s["allocated"]] for s in list(store.memory)[-240:]]
        self.spark.value = sparkline(tl)
        live = cell_tracker.live()
        self.running.value = (
            f"running <code>{html.escape(str(live['cell_id']))}</code>: "
            f"{live['elapsed_s']:.1f} s, {live['ops']} ops ({live['ops_per_s']:.0f}/s), "
            f"{live['launches']} launches, fused {live['fused_share']:.0%}, "
            f"compile queue {live['compile_queue']}" if live["cell_id"] else
            f"idle; compile queue {live['compile_queue']}")
        if store.fallback_seq != self._fallback_seq:
            self._fallback_seq = store.fallback_seq
            self.fallbacks.value = fallback_table()._repr_html_()
        self.ticks += 1

    def idle_change(self) -> None:
        self.tick()
        self.regions.value = region_table()._repr_html_()

    # --- the slow part: per cell -------------------------------------------------------------
    def _plot(self, m: dict) -> bytes:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        if self._fig is None:
            self._fig = Figure(figsize=(6, 2.4), dpi=72)
            FigureCanvasAgg(self._fig)
            self._axes = self._fig.subplots(1, 2)
        ax1, ax2 = self._axes
        ax1.cla()
        ax2.cla()
        tl = m["memory"]["timeline"]
        ax1.plot([t for t, _ in tl], [a / 2**20 for _, a in tl], color="tab:blue")
        ax1.set_title("allocated (MiB) over s", fontsize=9)
        recent = m["cells"][-12:]
        xs = [str(c.get("index", i)) for i, c in enumerate(recent)]
        ax2.bar(xs, [c["wall_s"] for c in recent], color="tab:gray", label="wall")
        ax2.bar(xs, [c["device_s"] for c in recent], color="tab:orange", label="host in launches")
        ax2.bar(xs, [c.get("modelled_s") or 0.0 for c in recent], color="tab:green", width=0.4,
                label="modelled trn2")
        ax2.set_title("per-cell time (s)", fontsize=9)
        if recent:
            ax2.legend(fontsize=7)
        self._fig.tight_layout()
        buf = io.BytesIO()
        self._fig.canvas.print_png(buf)
        return buf.getvalue()

    def cell_finished(self, _record=None) -> None:
        """Per cell: tables now; the figure on a thread (it can take a few hundred ms)."""
        m = metrics()
        self.cells.value = Table("", m["cells"][-10:], CELL_COLUMNS)._repr_html_()
        self.regions.value = region_table()._repr_html_()
        self.tick()
        threading.Thread(target=self._redraw, args=(m,), name="neuron_lab-dashplot",
                         daemon=True).start()

    def _redraw(self, m: dict) -> None:
        with self._plot_lock:
            self.timeline.value = self._plot(m)

    def refresh(self, _sample=None) -> None:
        """Everything, synchronously."""
        m = metrics()
        self.cells.value = Table("", m["cells"][-10:], CELL_COLUMNS)._repr_html_()
        self.regions.value = region_table()._repr_html_()
        self._fallback_seq = -1
        self.tick()
        self._redraw(m)

    # --- wiring ---------------------------------------------------------------------------------
    def attach(self, state: dict) -> None:
        """Follow the extension's sampler (ticks), watcher (idle changes) and cell ends."""
        for key, fn in (("sampler", self.tick), ("watcher", self.idle_change)):
            src = state.get(key)
            if src is not None:
                src.listeners.append(fn)
                self._detach.append((src.listeners, fn))
        lst = state.get("cell_listeners")
        if lst is not None:
            lst.append(self.cell_finished)
            self._detach.append((lst, self.cell_finished))

    def close(self) -> None:
        for lst, fn in self._detach:
            if fn in lst:
                lst.remove(fn)
        self._detach.clear()
        self.widget.close()

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget)


def dashboard() -> Dashboard:
    """Show the live dashboard; in IPython it loads ``%load_ext neuron_lab`` if needed, so it
    refreshes while cells run (and on change while idle)."""
    from .extension import _state
    if not _state:
        try:
            from IPython import get_ipython
            ip = get_ipython()
        except ImportError:
            ip = None
        if ip is not None:
            ip.extension_manager.load_extension("neuron_lab")
    d = Dashboard()
    d.attach(_state)
    return d
