"""A live line plot (textual-plotext) of one metric per peer over the last N seconds.

The widget is created once; each tick only its data changes (`show(...)`),
and it rebuilds the plotext figure only when that data differs and the
widget is on screen. Lines are thinned to what the plot width can show;
lines that coincide take turns (plot_overlap), the time axis has one unit
(plot_ticks), and the title and legend are the longest variants that fit.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import RenderResult
from textual.reactive import reactive
from textual_plotext import PlotextPlot

from ..dashboard.history import Series
from .palette import slot_marker, slot_rgb
from .plot_overlap import Stroke, interleave
from .plot_ticks import time_ticks

LINE_STEPS_BUDGET = 2500
NOTE_SHORT = 13
EXTRA_MARKER = "-"
"""Marker of the `extra` (configured) lines, in colour and under NO_COLOR alike."""

# The achieved plot's title and legend, longest first (each plot shows the longest that fits).
ACHIEVED_TITLES = ("achieved vs configured share %", "achieved vs configured %", "achieved %")
ACHIEVED_LEGENDS = ("⣿ achieved, 5s avg  -- configured", "⣿ achieved  -- configured", "⣿ achieved -- config")
ACHIEVED_MONO_LEGENDS = (  # NO_COLOR: each line is drawn with its slot's digit
    "slot digits: achieved, 5s avg  -- configured",
    "slot digits: achieved  -- configured",
    "digits: achieved  -- configured",
    "digits: ach  -- cfg",
)


def fitting(variants: Sequence[str], width: int) -> str:
    """The first (longest) variant that fits a border of `width` cells, else ""."""
    room = width - 6  # corners, the rule's first cell and a space each side
    return next((v for v in variants if len(v) <= room), "")


class SharePlot(PlotextPlot):
    """Percent (0..100) against time; colours by slot, like the table and the timeline
    (under NO_COLOR: each line drawn with its slot's digit)."""

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

    def __init__(
        self,
        title: str | Sequence[str],
        *,
        span_s: float = 120.0,
        empty: str | Sequence[str] = "no data yet",
        legend: Sequence[str] = (),
        mono_legend: Sequence[str] = ("digit = slot",),
        **kwargs,
    ) -> None:
        """`title`, `empty` (said when there is no line), `legend` (colour) and `mono_legend`
        (NO_COLOR): variants, longest first; each time the longest that fits is shown."""
        super().__init__(**kwargs)
        self.titles = (title,) if isinstance(title, str) else tuple(title)
        self.legends = tuple(legend)
        self.mono_legends = tuple(mono_legend)
        self.set_reactive(SharePlot.span_s, span_s)
        self.empty = (empty,) if isinstance(empty, str) else tuple(empty)
        self._series: tuple[Series, ...] = ()
        self._extra: tuple[Series, ...] = ()
        self._note: str | None = None
        self.border_title = self.titles[0]

    def show(self, series: tuple[Series, ...], extra: tuple[Series, ...] = (), note: str | None = None) -> None:
        """`extra` lines are drawn dashed (e.g. the configured share under the achieved one);
        `note` (e.g. the GPU) goes before the legend where it fits."""
        if series == self._series and extra == self._extra and note == self._note:
            return
        self._series, self._extra, self._note = series, extra, note
        self._fit_labels()
        self.refresh()

    def on_resize(self) -> None:
        self._fit_labels()

    def _fit_labels(self) -> None:
        """Title and subtitle never cut: the longest variant that fits the width, or none."""
        width = self.outer_size.width or 80
        self.border_title = fitting(self.titles, width) or self.titles[-1]
        legends = self.mono_legends if self.app.no_color else self.legends
        if not (self._series or self._extra):
            legends = ()
        notes = [self._note] if self._note else []
        if self._note and len(self._note) > NOTE_SHORT:
            notes.append(self._note[: NOTE_SHORT - 1] + "…")  # a GPU UUID: its first group says which
        variants = [f"{n} · {v}" for n in notes for v in legends] + list(legends) if legends else notes
        self.border_subtitle = fitting(variants, width)

    @property
    def legend(self) -> str:
        """The legend variant in use (what the subtitle says about the markers)."""
        return str(self.border_subtitle)

    @property
    def buckets(self) -> int:
        """Time buckets worth drawing: two per data column (braille dots)."""
        return max(16, 2 * (self.size.width - 8))

    def _canvas(self) -> tuple[int, int]:
        """Cells of the plotting area (without the axes and their labels), roughly."""
        return max(1, self.size.width - 5), max(1, self.size.height - 4)

    def _line_cost(self, s: Stroke) -> float:
        """Braille dots plotext steps through to join this line's points (its cost)."""
        w, h = self._canvas()
        kx, ky = 2 * w / self.span_s, 4 * h / 100
        return sum(
            max(abs(x1 - x0) * kx, abs(y1 - y0) * ky) + 1 for x0, x1, y0, y1 in zip(s.xs, s.xs[1:], s.ys, s.ys[1:])
        )

    def strokes(self) -> list[tuple[Stroke, str]]:
        """(stroke, marker) in drawing order: the extra lines first, then the main ones."""
        no_color = self.app.no_color
        cols, rows = self._canvas()
        out = [(s, EXTRA_MARKER) for s in interleave(self._extra, self.span_s, cols, rows)]
        for s in interleave(self._series, self.span_s, cols, rows):
            out.append((s, slot_marker(s.slot) if no_color else "braille"))
        return out

    def render(self) -> RenderResult:
        """Lines are joined while the plot's budget of interpolation steps lasts (plotext
        joins points in Python, ~5 µs a dot); beyond it, noisy lines are drawn as one
        dot per time bucket, which at braille resolution still reads as a line."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        if not self._series and not self._extra:
            plt.title(fitting(self.empty, self._canvas()[0] + 6) or self.empty[-1])
        budget: float = LINE_STEPS_BUDGET
        for s, marker in self.strokes():
            cost = self._line_cost(s)
            if s.joined and (cost <= budget or len(s.xs) <= 2):
                budget -= cost
                plt.plot(list(s.xs), list(s.ys), color=slot_rgb(s.slot), marker=marker)
            else:
                plt.scatter(list(s.xs), list(s.ys), color=slot_rgb(s.slot), marker=marker)
        plt.xlim(-self.span_s, 0)
        plt.ylim(0, 100)
        ticks = time_ticks(self.span_s, self._canvas()[0])
        plt.xticks([x for x, _ in ticks], [label for _, label in ticks])
        plt.yticks([0, 25, 50, 75, 100])
        return super().render()
