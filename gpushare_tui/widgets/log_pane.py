"""`L`: a managed engine's log over the dashboard, its last lines, then following it.

The file is read by a `core.logtail.LogFollower` a few times a second, at most
MAX_READ_BYTES per read (a burst of output skips ahead instead of stalling the UI),
and at most MAX_LINES are kept. Every line is made printable first.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Label, Log, Static

from ..core.host.errors import GpushareError
from ..core.host.logtail import LogFollower, display_line
from ..core.host.text import printable
from ..core.pacing.control import Target, reported_log
from ..dashboard.model import PeerRow
from ..dashboard.protocols import ControlClient
from .dialog import Dialog

POLL_S = 0.3
FIRST_LINES = 200
MAX_LINES = 2000
MAX_READ_BYTES = 64 * 1024


def open_engine_log(control: ControlClient, row: PeerRow) -> LogFollower:
    """The log of the row's engine, open at its last FIRST_LINES lines (blocking: call it off the UI
    thread). GpushareError with a one-line reason: not reachable, no log, log unreadable."""
    pid = row.peer.pid
    target = Target(slot=row.peer.slot, gpu_key=row.gpu_key)  # the row's engine, if the pid serves several
    path = reported_log(pid, control.request(pid, "status", timeout_s=3.0, target=target))
    try:
        return LogFollower(path, FIRST_LINES, max_read_bytes=MAX_READ_BYTES)
    except GpushareError as e:
        raise GpushareError(f"engine {pid}: {printable(str(e))}") from None


class LogPane(Dialog[None]):
    """Shows `follower`'s log (opened by the caller, off the UI thread: `open_engine_log`) until closed."""

    DEFAULT_CSS = """
    LogPane > Vertical { width: 100%; height: 100%; padding: 0 1; }
    LogPane .title { margin-bottom: 0; }
    LogPane #log-path { color: $text-muted; height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    LogPane Log { height: 1fr; background: $surface; }
    LogPane #log-hint { color: $text-muted; height: 1; }
    """

    BINDINGS = [Binding("escape,q,L", "close", "Close")]

    def __init__(self, row: PeerRow, follower: LogFollower) -> None:
        super().__init__()
        self.row = row
        self.follower = follower

    def compose(self) -> ComposeResult:
        p = self.row.peer
        with Vertical():
            yield Label(f"log of {p.name or 'engine'} (pid {p.pid})", classes="title", markup=False)
            yield Static(printable(self.follower.path), id="log-path", markup=False)
            yield Log(max_lines=MAX_LINES, id="log-lines")
            yield Static(f"following (every {POLL_S:g} s) · ← → scroll · Esc / L / q closes", id="log-hint")

    def on_mount(self) -> None:
        lines = self.query_one(Log)
        try:
            lines.write_lines([display_line(s) for s in self.follower.first_lines()])  # bounded: MAX_READ_BYTES
        except GpushareError as e:
            lines.write_line(f"── {printable(str(e))} ──")
        lines.focus()
        self._timer = self.set_interval(POLL_S, self.poll)

    def poll(self) -> None:
        """Show what was appended since the last poll (bounded: see the module)."""
        out = self.query_one(Log)
        try:
            up = self.follower.poll()
        except GpushareError as e:
            out.write_line(f"── {printable(str(e))}: no longer followed ──")
            self._timer.stop()
            self.follower.close()
            return
        if up.truncated:
            out.write_line("── log truncated: following it from its start ──")
        if up.rotated:
            out.write_line("── log replaced: following the new file ──")
        if up.skipped_bytes:
            out.write_line(f"── {up.skipped_bytes} bytes skipped ──")
        if up.lines:
            out.write_lines([display_line(s) for s in up.lines])

    def on_unmount(self) -> None:
        self.follower.close()

    def action_close(self) -> None:
        self.dismiss(None)
