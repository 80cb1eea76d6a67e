"""The TDM timeline: each member's window across one period, and a stroboscopic cursor.

The cursor is computed here, from the schedule the snapshot carries (period,
windows) and the clock the widget is given (the App's), not from the snapshot's
time: the widget redraws its cursor line on its own timer, one frame of
`dashboard.strobe.Strobe` at a time (a true sample of the phase; the sweep 17×
to 65× slower than real time), while the 1 s refresh only updates the windows
when they change. The line's right-hand legend says so: `strobe 33× slower`
above `period 160 ms`.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.timer import Timer
from textual.widget import Widget

from ..core.host.clock import ClockUs, wall_us
from ..core.observe.snapshot import GpuSnapshot, PeerSnapshot
from ..core.schedule import v1 as schedule
from ..dashboard.strobe import Strobe
from .palette import slot_colour, slot_fill

_DIM = Style(color="#808080")
_FG_ON_COLOUR = Style(color="#101010", bold=True)
LEGEND_MIN_BAR = 40  # narrower than this and the legend is left out (the panel's info line still says the period)
OFFSCREEN_RECHECK_S = 0.5  # a timeline scrolled out of view draws nothing; it looks again this often
FRAME_SLACK_S = 0.002  # wake just after a frame's instant, never just before


def _segments(snap: GpuSnapshot) -> list[tuple[int, int, int, str]]:
    """(start_us, end_us, slot, name) of each window, in time order."""
    segs = [
        (p.window_us[0], p.window_us[1], p.slot, p.name or f"pid {p.pid}")
        for p in snap.peers
        if p.window_us is not None
    ]
    segs.sort()
    return segs


def legends(snap: GpuSnapshot) -> tuple[str, str]:
    """The right-hand legend: above the cursor line, what the cursor shows; beside the bar, the period."""
    if snap.period_ms is None:
        return "", ""
    return f"strobe {Strobe(snap.period_ms * 1000).slowdown:.0f}× slower", f"period {snap.period_ms} ms"


def bar_width(snap: GpuSnapshot | None, width: int) -> int:
    """Columns for the period bar: the width less the legend's, when both fit."""
    if snap is None or snap.period_ms is None:
        return width
    legend = max(len(s) for s in legends(snap)) + 1
    return width - legend if width - legend >= LEGEND_MIN_BAR else width


def _lone_member(snap: GpuSnapshot) -> PeerSnapshot | None:
    """With no schedule (period None): the active member that runs unthrottled, if any."""
    return next((p for p in snap.peers if p.alive and p.active and p.weight is not None), None)


def cursor_line(snap: GpuSnapshot | None, width: int, cursor_us: int) -> Text:
    """▼ at instant cursor_us's phase, naming who may run then; the strobe legend at the right."""
    width = max(width, 10)
    if snap is None:
        return Text("")
    if snap.period_ms is None:
        m = _lone_member(snap)
        if m is not None:
            return Text(_fit(f"▼ now: {m.name or m.pid} may run", width), style=Style(color=slot_colour(m.slot)))
        return Text(_fit("▼ now: any engine may run (idle)", width), style=_DIM)

    bar_w = bar_width(snap, width)
    period_us = snap.period_ms * 1000
    cursor_col = min(bar_w - 1, (cursor_us % period_us) * bar_w // period_us)
    running = schedule.holder_at(period_us, ((p.slot, p.window_us) for p in snap.peers), cursor_us)
    runner = next((p for p in snap.peers if p.slot == running), None)

    label = f"now: {runner.name or runner.pid} may run" if runner else "now"
    if cursor_col + 2 + len(label) <= bar_w:
        head = Text(" " * cursor_col) + Text("▼ ", style="bold") + Text(label)
    elif cursor_col - 1 - len(label) >= 0:
        head = Text(" " * (cursor_col - 1 - len(label))) + Text(label + " ") + Text("▼", style="bold")
    else:
        head = Text(" " * cursor_col) + Text("▼", style="bold")
    if runner is not None:
        head.stylize(Style(color=slot_colour(runner.slot)), 0, len(head))
    head.truncate(bar_w, pad=True)
    if bar_w < width:
        head.append(_fit(" " + legends(snap)[0], width - bar_w), _DIM)
    return head


def bar_line(snap: GpuSnapshot | None, width: int, no_color: bool = False) -> Text:
    """Each window in its peer's colour, labelled, one cell per width/period; the period at the right."""
    width = max(width, 10)
    if snap is None:
        return Text("")
    if snap.period_ms is None:
        m = _lone_member(snap)
        if m is not None:
            label = f" {m.name or m.pid}: runs alone, unthrottled (no schedule with one member) "
            return Text(_fit(label, width), style=_colour_style(m.slot, no_color))
        return Text(_fit(" no active members: nobody is paced ", width), style=_DIM)

    bar_w = bar_width(snap, width)
    period_us = snap.period_ms * 1000
    segs = _segments(snap)
    bar = Text()
    col = 0
    for i, (start, end, slot, name) in enumerate(segs):
        end_col = bar_w if i == len(segs) - 1 else min(bar_w, round(end * bar_w / period_us))
        n = end_col - col
        if n <= 0:
            continue
        ms = (end - start) / 1000
        text = window_label(name, ms, n)
        if no_color:
            cell = (text + slot_fill(slot) * n)[:n]
        else:
            cell = _fit(text, n)
        bar.append(cell, _colour_style(slot, no_color))
        col = end_col
    if col < bar_w:
        bar.append(" " * (bar_w - col))
    if bar_w < width:
        bar.append(_fit(" " + legends(snap)[1], width - bar_w), _DIM)
    return bar


def window_label(name: str, ms: float, cells: int) -> str:
    """A window's label in its `cells`: ` name 40ms`, else ` name`, else the name cut with `…`, always with a
    blank cell after it, so a label never runs into the next window's (` agent chat 300ms` read as one)."""
    for text in (f" {name} {ms:.0f}ms", f" {name}"):
        if len(text) < cells:
            return text
    return f" {name[: cells - 3]}…" if cells >= 4 else ""


def _fit(s: str, n: int) -> str:
    return s[:n].ljust(n)


def _colour_style(slot: int, no_color: bool) -> Style:
    if no_color:
        return Style(bold=True)
    return Style(bgcolor=slot_colour(slot)) + _FG_ON_COLOUR


def drawn_key(snap: GpuSnapshot | None) -> tuple | None:
    """What the timeline draws from a snapshot, less its time: equal keys draw the same windows."""
    if snap is None:
        return None
    return (
        snap.period_ms,
        tuple((p.slot, p.pid, p.name, p.window_us, p.alive, p.active, p.weight is None) for p in snap.peers),
    )


class Timeline(Widget):
    """`show(snapshot)` updates the windows when they change; a one-shot timer per strobe frame
    redraws only the cursor line. No timer without a schedule; none while scrolled out of view
    (it looks again every OFFSCREEN_RECHECK_S). `clock`: the cursor's, CLOCK_REALTIME as the phase is
    (spec §5); the App passes its own (frozen in tests). A remote host's GPU is drawn on our clock
    (NTP keeps them ms apart)."""

    DEFAULT_CSS = """
    Timeline { height: 2; width: 1fr; }
    """

    def __init__(self, snapshot: GpuSnapshot | None = None, *, clock: ClockUs = wall_us, **kwargs) -> None:
        super().__init__(**kwargs)
        self._clock = clock
        self._snap = snapshot
        self._key = drawn_key(snapshot)
        self._strobe = _strobe_of(snapshot)
        self._frame: int | None = None  # the strobe frame drawn (None: none yet)
        self._timer: Timer | None = None
        self._head: tuple[tuple, Strip] | None = None  # (cache key, strip) of the cursor line
        self._bar: tuple[tuple, Strip] | None = None
        self._base: Style | None = None  # rich_style, which refresh() would recompute
        self.frames = 0  # frames the timer drew (tests and the bench count them)
        self.ticks = 0  # timer callbacks, drawn or not

    @property
    def strobe(self) -> Strobe | None:
        return self._strobe

    @property
    def cursor_us(self) -> int:
        """The instant the cursor line shows: the current strobe frame's (the clock's now, without a schedule)."""
        now = self._clock()
        if self._strobe is None:
            return now
        frame = self._frame if self._frame is not None else self._strobe.frame(now)
        return self._strobe.sample_us(frame)

    def on_mount(self) -> None:
        self.call_after_refresh(self._arm)

    def on_unmount(self) -> None:
        self._stop()

    def show(self, snapshot: GpuSnapshot) -> None:
        key = drawn_key(snapshot)
        self._snap = snapshot
        if key == self._key:
            return
        self._key = key
        strobe = _strobe_of(snapshot)
        if strobe != self._strobe:
            self._strobe, self._frame = strobe, None
            self._stop()
            self._arm()
        self._head = self._bar = None
        self.refresh()

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def _arm(self) -> None:
        """Start the animation when there is a schedule (a no-op while it runs)."""
        if self._strobe is not None and self._timer is None and self.is_attached:
            self._tick()

    def _visible(self) -> bool:
        try:
            return self.screen.find_widget(self).visible_region.area > 0
        except Exception:  # not laid out yet, or being removed
            return False

    def _tick(self) -> None:
        """Draw the current frame if it is new, then sleep until the next one."""
        self._timer = None
        strobe = self._strobe
        if strobe is None or not self.is_attached:
            return
        self.ticks += 1
        if not self._visible():
            self._timer = self.set_timer(OFFSCREEN_RECHECK_S, self._tick)
            return
        now = self._clock()
        frame = strobe.frame(now)
        if frame != self._frame:
            self._frame = frame
            self.frames += 1
            self.refresh(Region(0, 0, self.size.width, 1))  # the cursor line only
        self._timer = self.set_timer(strobe.until_next_us(now) / 1e6 + FRAME_SLACK_S, self._tick)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        no_color = self.app.no_color
        if y == 0:
            t = self.cursor_us
            head_key = (width, self._key, t if self._strobe is not None else None, no_color)
            if self._head is None or self._head[0] != head_key:
                self._head = (head_key, self._strip(cursor_line(self._snap, width, t), width))
            return self._head[1]
        if y == 1:
            bar_key = (width, self._key, no_color)
            if self._bar is None or self._bar[0] != bar_key:
                self._bar = (bar_key, self._strip(bar_line(self._snap, width, no_color), width))
            return self._bar[1]
        return Strip.blank(width, self._base_style())

    def _base_style(self) -> Style:
        if self._base is None:
            self._base = self.rich_style
        return self._base

    def _strip(self, text: Text, width: int) -> Strip:
        base = self._base_style()
        return Strip(list(Segment.apply_style(text.render(self.app.console), base))).crop_extend(0, width, base)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._head = self._bar = self._base = None


def _strobe_of(snap: GpuSnapshot | None) -> Strobe | None:
    return Strobe(snap.period_ms * 1000) if snap is not None and snap.period_ms is not None else None
