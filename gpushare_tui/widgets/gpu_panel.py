"""One GPU (segment): device stats from NVML, the period, and the TDM timeline."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical

from ..core.host.clock import ClockUs, wall_us
from ..core.host.text import counted
from ..core.observe.gpu import DeviceStats
from ..core.observe.snapshot import GpuSnapshot
from ..dashboard.columns import schedule_note, users_note
from ..dashboard.model import GpuView
from .text_line import TextLine
from .timeline import Timeline


def _num(x: float | None, spec: str, unit: str = "") -> str | None:
    return None if x is None else f"{format(x, spec)}{unit}"


def device_parts(dev: DeviceStats | None) -> list[str]:
    """The device readings, most useful first."""
    if dev is None:
        return ["no NVML device for this key"]
    parts = []
    if (u := _num(dev.util_pct, ".0f", "%")) is not None:
        parts.append(f"util {u}")
    if dev.mem_used_mib is not None and dev.mem_total_mib is not None:
        parts.append(f"mem {dev.mem_used_mib / 1024:.1f}/{dev.mem_total_mib / 1024:.1f} GiB")
    if (t := _num(dev.temperature_c, ".0f", "°C")) is not None:
        parts.append(t)
    if (p := _num(dev.power_w, ".0f", " W")) is not None:
        parts.append(p)
    return parts or ["NVML: no readings"]


def info_line(view: GpuView, width: int | None = None) -> Text:
    """Period, peers and device readings; at `width`, the last device readings are left out
    rather than cut (a warning when others may write the segment always stays first)."""
    snap = view.snapshot
    alive = sum(1 for p in snap.peers if p.alive)
    active = sum(1 for p in snap.peers if p.alive and p.active)
    period = f"period {snap.period_ms} ms" if snap.period_ms is not None else "no schedule (unthrottled)"
    peers = f" · {counted(alive, 'peer')}, {active} active"
    note = schedule_note(snap)  # Extensions 1 and 2 in words: "interactive first, fair between users"
    peers += f" · {note}" if note else ""
    warn = f"⚠ {'world' if snap.mode & 0o002 else 'group'}-writable · " if snap.writable_by_others else ""
    dev = device_parts(view.device)
    while width is not None and len(dev) > 1 and len(warn + period + peers + " · " + " · ".join(dev)) > width:
        dev.pop()
    t = Text()
    if warn:
        t.append(warn, style="bold yellow")
    t.append(period, style="bold")
    t.append(peers)
    t.append(" · ")
    t.append(" · ".join(dev), style="dim" if view.device is None else "")
    return t


class InfoLine(TextLine):
    """The panel's first line, laid out to its width."""

    def __init__(self, view: GpuView, **kwargs) -> None:
        super().__init__(info_line(view), **kwargs)
        self._view = view

    def show(self, view: GpuView) -> None:
        self._view = view
        self.set_text(info_line(view))

    def build_text(self, width: int) -> Text:
        return info_line(self._view, width)


def subtitle(snap: GpuSnapshot) -> Text:
    """Segment, owner, and a warning when others may write it (plain Text: names are never markup)."""
    t = Text(snap.segment)
    if snap.owner:
        t.append(f" · owner {snap.owner}")
    if snap.writable_by_others:
        who = "world" if snap.mode & 0o002 else "group"
        t.append(f" ⚠ {who}-writable {snap.mode:04o}", style="bold yellow")
    return t


class GpuPanel(Vertical):
    """Updated in place with `show(view)`; never re-created per tick. `clock`: its timeline's (see Timeline)."""

    DEFAULT_CSS = """
    GpuPanel {
        height: auto;
        border: round $primary 60%;
        border-title-color: $text;
        border-title-style: bold;
        border-subtitle-color: $text-muted;
        padding: 0 1;
    }
    GpuPanel.-selected { border: round $accent; }
    GpuPanel > .gpu-info { height: 1; }
    GpuPanel > .gpu-users { height: 1; }
    """

    def __init__(self, view: GpuView, *, clock: ClockUs = wall_us, **kwargs) -> None:
        super().__init__(**kwargs)
        self.gpu_key = view.gpu_key
        self._view = view
        self._info = InfoLine(view, classes="gpu-info")
        self._users = TextLine(users_note(view.snapshot), classes="gpu-users")  # Extension 2: two users or more
        self._users.display = bool(users_note(view.snapshot))
        self._timeline = Timeline(view.snapshot, clock=clock)
        self._set_titles(view)

    def compose(self) -> ComposeResult:
        yield self._info
        yield self._users
        yield self._timeline

    def _set_titles(self, view: GpuView) -> None:
        name = view.device.name if view.device and view.device.name else None
        self.border_title = f"{view.gpu_key} · {name}" if name else view.gpu_key
        self.border_subtitle = subtitle(view.snapshot)

    def show(self, view: GpuView) -> None:
        old = self._view
        self._view = view
        o, n = old.snapshot, view.snapshot
        if old.device != view.device or (o.segment, o.owner, o.mode) != (n.segment, n.owner, n.mode):
            self._set_titles(view)
        self._info.show(view)
        note = users_note(view.snapshot)
        self._users.set_text(Text(note))
        self._users.display = bool(note)
        self._timeline.show(view.snapshot)
