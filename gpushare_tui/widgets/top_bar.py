"""The one-line title bar: host, time of the data, refresh interval, mode."""

from __future__ import annotations

import socket
import time

from rich.text import Text

from ..core.host.text import counted
from .text_line import TextLine


def top_text(
    now_us: int | None, n_gpus: int, n_peers: int, interval_s: float, readonly: bool, host: str | None = None
) -> Text:
    """`n_peers`: the live ones (a dead slot is no peer; the GPU panels count the same)."""
    t = Text()
    t.append(" gpushare-tui ", style="bold reverse")
    if readonly:
        t.append(" READ-ONLY ", style="bold black on yellow")
    t.append(f"  {host or socket.gethostname()}")
    if now_us is not None:
        t.append("  " + time.strftime("%H:%M:%S", time.localtime(now_us / 1e6)))
    t.append(f"  {counted(n_gpus, 'GPU segment')} · {counted(n_peers, 'peer')}")
    t.append(f"  refresh {interval_s:g}s")
    return t


class TopBar(TextLine):
    DEFAULT_CSS = """
    TopBar { height: 1; background: $panel; }
    """

    def __init__(self, interval_s: float, readonly: bool, host: str | None = None, **kwargs) -> None:
        super().__init__(top_text(None, 0, 0, interval_s, readonly, host), **kwargs)
        self.interval_s = interval_s
        self.readonly = readonly
        self.host = host

    def show(self, now_us: int, n_gpus: int, n_peers: int) -> None:
        self.set_text(top_text(now_us, n_gpus, n_peers, self.interval_s, self.readonly, self.host))
