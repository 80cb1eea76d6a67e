"""A live line plot (textual-plotext) of one metric per peer over the last N seconds.

The widget is created once; each tick only its data changes (`show(...)`),
and it rebuilds the plotext figure only when that data differs and the
widget is on screen. Lines are thinned to what the plot width can show.
"""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual_plotext import PlotextPlot

from ..dashboard.model import Series
from .palette import slot_marker, slot_rgb

LINE_STEPS_BUDGET = 2500


def _span_label(s: float) -> str:
    return f"-{s / 60:g}m" if s >= 60 and s % 60 == 0 else f"-{s:g}s"


class SharePlot(PlotextPlot):
    """Percent (0..100) against time; colours by slot, like the table and the timeline."""

    DEFAULT_CSS = """
    SharePlot {
        height: 1fr;
        width: 1fr;
        border: round $primary 40%;
        border-title-color: $text;
        border-subtitle-color: $text-muted;
    }
    """

    span_s: reactive[float] = reactive(120.0, init=False)
    """Seconds of history across the x axis (repaints when set)."""

    def __init__(self, title: str, *, span_s: float = 120.0, empty: str = "no data yet", **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = title
        self.set_reactive(SharePlot.span_s, span_s)
        self.empty = empty
        self._series: tuple[Series, ...] = ()
        self._extra: tuple[Series, ...] = ()
        self._note: str | None = None

    def show(self, series: tuple[Series, ...], extra: tuple[Series, ...] = (), note: str | None = None) -> None:
        """`extra` lines are drawn dashed (e.g. the configured share under the achieved one)."""
        if series == self._series and extra == self._extra and note == self._note:
            return
        self._series, self._extra, self._note = series, extra, note
        self.border_subtitle = note or ""
        self.refresh()

    @property
    def buckets(self) -> int:
        """Time buckets worth drawing: two per data column (braille dots)."""
        return max(16, 2 * (self.size.width - 8))

    def _line_cost(self, s: Series) -> int:
        """Braille dots plotext steps through to join this line's points (its cost)."""
        w, h = max(1, self.size.width - 8), max(1, self.size.height - 5)
        kx, ky = 2 * w / self.span_s, 4 * h / 100
        return sum(
            max(abs(x1 - x0) * kx, abs(y1 - y0) * ky) + 1 for x0, x1, y0, y1 in zip(s.xs, s.xs[1:], s.ys, s.ys[1:])
        )

    def render(self) -> Text:  # type: ignore[override]
        """Lines are joined while the plot's budget of interpolation steps lasts (plotext
        joins points in Python, ~5 µs a dot); beyond it, noisy lines are drawn as one
        dot per time bucket, which at braille resolution still reads as a line."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        no_color = self.app.no_color
        if not self._series and not self._extra:
            plt.title(self.empty)
        budget = LINE_STEPS_BUDGET
        for s, marker in [(s, "-") for s in self._extra] + [(s, "braille") for s in self._series]:
            marker = slot_marker(s.slot) if no_color else marker
            cost = self._line_cost(s)
            if cost <= budget or len(s.xs) <= 2:
                budget -= cost
                plt.plot(list(s.xs), list(s.ys), color=slot_rgb(s.slot), marker=marker)
            else:
                plt.scatter(list(s.xs), list(s.ys), color=slot_rgb(s.slot), marker=marker)
        plt.xlim(-self.span_s, 0)
        plt.ylim(0, 100)
        ticks = [-self.span_s, -self.span_s * 3 / 4, -self.span_s / 2, -self.span_s / 4, 0]
        plt.xticks(ticks, [_span_label(-t) if t else "now" for t in ticks])
        plt.yticks([0, 25, 50, 75, 100])
        return super().render()  # type: ignore[return-value]
