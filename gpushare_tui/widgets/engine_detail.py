"""`d`: one managed engine's latency as its clients see it, over the dashboard: the last minute's figures, its
target and what its governor did (when it has one), and a plot of its TTFT p99/p50 and ITL p99 over the plots'
time span (the target dashed). Updated at every refresh while open (`show`); Esc, `d` or `q` closes it."""

from __future__ import annotations

from textual.app import ComposeResult, RenderResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Label, Static
from textual_plotext import PlotextPlot

from ..core.host.text import printable
from ..dashboard.columns import latency_text, slo_text
from ..dashboard.history import Series
from ..dashboard.model import PeerRow
from .dialog import Dialog
from .palette import slot_marker, slot_rgb
from .plot_ticks import time_ticks

NO_LATENCY = (
    "no latency figures: this engine reports none (its requests pass no front proxy of gpushare-tui, which a "
    "supervised engine's port has; or it is not ours to ask: see docs/latency.md)"
)


class LatencyPlot(PlotextPlot):
    """Milliseconds against time: the engine's latency lines (coloured by line), the target dashed."""

    DEFAULT_CSS = """
    LatencyPlot { height: 1fr; min-height: 8; border: round $primary 40%; border-title-color: $text; }
    """

    def __init__(self, span_s: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.span_s = span_s
        self.series: tuple[Series, ...] = ()
        self.target_ms: float | None = None
        self.border_title = "latency, ms"

    def show(self, series: tuple[Series, ...], target_ms: float | None, span_s: float) -> None:
        if (series, target_ms, span_s) == (self.series, self.target_ms, self.span_s):
            return
        self.series, self.target_ms, self.span_s = series, target_ms, span_s
        self.border_subtitle = " · ".join(s.label for s in series) + (" · -- target" if target_ms else "")
        self.refresh()

    def render(self) -> RenderResult:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        if not self.series:
            plt.title("no figures yet")
        top = max([y for s in self.series for y in s.ys] + [self.target_ms or 0.0, 1.0])
        for s in self.series:
            marker = slot_marker(s.slot) if self.app.no_color else "braille"
            plt.plot(list(s.xs), list(s.ys), color=slot_rgb(s.slot), marker=marker)
        if self.target_ms is not None:
            plt.plot([-self.span_s, 0.0], [self.target_ms, self.target_ms], color=(160, 160, 160), marker="-")
        plt.xlim(-self.span_s, 0)
        plt.ylim(0, top * 1.1)
        ticks = time_ticks(self.span_s, max(1, self.size.width - 5))
        plt.xticks([x for x, _ in ticks], [label for _, label in ticks])
        return super().render()


class EngineDetail(Dialog[None]):
    """The selected engine's latency (see the module). The App calls `show` with each new model's row and the
    engine's latency lines from its history."""

    DEFAULT_CSS = """
    EngineDetail > Vertical { width: 100%; height: 100%; padding: 0 1; }
    EngineDetail .title { margin-bottom: 0; }
    EngineDetail .figures { color: $text; height: auto; }
    EngineDetail #detail-hint { color: $text-muted; height: 1; }
    """

    BINDINGS = [Binding("escape,q,d", "close", "Close")]

    def __init__(self, row: PeerRow, series: tuple[Series, ...], span_s: float) -> None:
        super().__init__()
        self.row = row
        self._first = (series, span_s)

    def compose(self) -> ComposeResult:
        p = self.row.peer
        with Vertical():
            yield Label(f"latency of {p.name or 'engine'} (pid {p.pid})", classes="title", markup=False)
            yield Static("", id="detail-latency", classes="figures", markup=False)
            yield Static("", id="detail-slo", classes="figures", markup=False)
            yield LatencyPlot(self._first[1], id="detail-plot")
            yield Static("refreshed with the dashboard · Esc / d / q closes", id="detail-hint")

    def on_mount(self) -> None:
        self.show(self.row, *self._first)

    def show(self, row: PeerRow, series: tuple[Series, ...], span_s: float) -> None:
        """The row's figures now and its latency lines (ms); the row may be gone (dead): its last figures stay."""
        self.row = row
        e = row.engine
        lat = row.latency
        self.query_one("#detail-latency", Static).update(printable(latency_text(lat)) if lat else NO_LATENCY)
        slo = e.slo if e is not None else None
        self.query_one("#detail-slo", Static).update(
            "target: " + printable(slo_text(slo)) if slo else "no latency target (slo) declared"
        )
        self.query_one(LatencyPlot).show(series, slo.ttft_p99_ms if slo else None, span_s)

    def action_close(self) -> None:
        self.dismiss(None)
