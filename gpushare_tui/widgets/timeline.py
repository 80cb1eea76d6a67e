"""The TDM timeline: each member's window across one period, and a cursor at now."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

from ..core.snapshot import GpuSnapshot
from .palette import slot_colour, slot_fill
from .text_line import TextLine

_DIM = Style(color="#808080")
_FG_ON_COLOUR = Style(color="#101010", bold=True)


def _segments(snap: GpuSnapshot) -> list[tuple[int, int, int, str]]:
    """(start_us, end_us, slot, name) of each window, in time order."""
    segs = [
        (p.window_us[0], p.window_us[1], p.slot, p.name or f"pid {p.pid}")
        for p in snap.peers
        if p.window_us is not None
    ]
    segs.sort()
    return segs


def render_timeline(snap: GpuSnapshot | None, width: int, no_color: bool = False) -> Text:
    """Two lines: the cursor at now (with who may run), then the window bar."""
    width = max(width, 10)
    if snap is None:
        return Text("")
    if snap.period_ms is None:
        members = [p for p in snap.peers if p.alive and p.active and p.weight is not None]
        if members:
            m = members[0]
            label = f" {m.name or m.pid}: runs alone, unthrottled (no schedule with one member) "
            bar = Text(_fit(label, width), style=_colour_style(m.slot, no_color))
            head = Text(_fit(f"▼ now: {m.name or m.pid} may run", width), style=Style(color=slot_colour(m.slot)))
        else:
            bar = Text(_fit(" no active members: nobody is paced ", width), style=_DIM)
            head = Text(_fit("▼ now: any engine may run (idle)", width), style=_DIM)
        return Text("\n").join([head, bar])

    period_us = snap.period_ms * 1000
    segs = _segments(snap)
    pos = snap.now_us % period_us
    cursor_col = min(width - 1, int(pos * width / period_us))
    running = snap.running_slot()
    runner = next((p for p in snap.peers if p.slot == running), None)

    # Cursor line: ▼ at now, with the running member named beside it.
    label = f"now: {runner.name or runner.pid} may run" if runner else "now"
    head = Text(" " * width)
    if cursor_col + 2 + len(label) <= width:
        head = Text(" " * cursor_col) + Text("▼ ", style="bold") + Text(label)
    elif cursor_col - 1 - len(label) >= 0:
        head = Text(" " * (cursor_col - 1 - len(label))) + Text(label + " ") + Text("▼", style="bold")
    else:
        head = Text(" " * cursor_col) + Text("▼", style="bold")
    if runner is not None:
        head.stylize(Style(color=slot_colour(runner.slot)), 0, len(head))
    head.truncate(width, pad=True)

    # Bar: one cell per width/period; each window in its peer's colour, labelled.
    bar = Text()
    col = 0
    for i, (start, end, slot, name) in enumerate(segs):
        end_col = width if i == len(segs) - 1 else min(width, round(end * width / period_us))
        n = end_col - col
        if n <= 0:
            continue
        ms = (end - start) / 1000
        text = f" {name} {ms:.0f}ms" if n >= len(name) + 7 else (f" {name}" if n > 2 else "")
        if no_color:
            cell = (text + slot_fill(slot) * n)[:n]
        else:
            cell = _fit(text, n)
        bar.append(cell, _colour_style(slot, no_color))
        col = end_col
    if col < width:
        bar.append(" " * (width - col))
    return Text("\n").join([head, bar])


def _fit(s: str, n: int) -> str:
    return s[:n].ljust(n)


def _colour_style(slot: int, no_color: bool) -> Style:
    if no_color:
        return Style(bold=True)
    return Style(bgcolor=slot_colour(slot)) + _FG_ON_COLOUR


class Timeline(TextLine):
    """Renders the latest GpuSnapshot's windows; `show(snapshot)` updates in place."""

    DEFAULT_CSS = """
    Timeline { height: 2; width: 1fr; }
    """

    def __init__(self, snapshot: GpuSnapshot | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self._snap = snapshot

    def show(self, snapshot: GpuSnapshot) -> None:
        if snapshot != self._snap:
            self._snap = snapshot
            self._strips = None
            self.refresh()

    def build_text(self, width: int) -> Text:
        return render_timeline(self._snap, width, self.app.no_color)
