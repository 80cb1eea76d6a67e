"""Whether the socket listening on an engine's port is the engine's (issue 26 item 9): a health probe
or a gauge is believed only when what answers it is held by the engine's process tree (or by us:
the front proxy). Another process listening there (another user's squatter, bound before the
engine) makes `start` fail with one line naming the port and its owner, and a gauge read from it
is ignored. Ports on other hosts cannot be looked at and are taken as given."""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from ..host import sockets
from ..host.budgets import LISTENER_RECHECK_S
from ..host.errors import EngineError

OURS, NOBODY, FOREIGN = "ours", "nobody", "foreign"


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def url_address(url: str) -> tuple[str, int] | None:
    """(host, port) of an http URL (port 80 when not given), or None when it has no host."""
    parts = urlsplit(url)
    if not parts.hostname:
        return None
    try:
        return parts.hostname, parts.port or 80
    except ValueError:
        return None


class PortCheck:
    """Who listens on (`host`, `port`) against the tree `pids()` gives. `check()`: (OURS | NOBODY |
    FOREIGN, the line that says who, when FOREIGN). `trusted()`: the verdict, at most every
    `recheck_s`, saying a change to FOREIGN once (`say`)."""

    def __init__(
        self,
        host: str,
        port: int,
        pids: Callable[[], list[int]],
        *,
        recheck_s: float = LISTENER_RECHECK_S,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.host, self.port, self._pids = host, port, pids
        self._addrs = sockets.resolve_local(host)
        self.recheck_s, self._say = recheck_s, say
        self._checked_at: float | None = None
        self._trusted = False
        self._said = False

    def check(self) -> tuple[str, str | None]:
        if self._addrs is None:
            return OURS, None  # another host's port: not ours to look at
        found = [ln for ln in sockets.listeners(self.port) if any(ln.accepts(a) for a in self._addrs)]
        if not found:
            return NOBODY, None
        mine = sockets.socket_inodes([*self._pids(), os.getpid()])
        foreign = [ln for ln in found if ln.inode not in mine]
        if not foreign:
            return OURS, None
        ln = foreign[0]
        pids = sockets.holders(ln.inode)
        held = f"pid {', '.join(map(str, pids))}, " if pids else ""
        return FOREIGN, (
            f"port {self.port} on {self.host} is held by another process ({held}{_user(ln.uid)}, listening on {ln}),"
            " not by the engine: its answers are not trusted"
        )

    def ready(self) -> bool:
        """For a readiness wait: True when the engine holds the port, False while nobody listens;
        EngineError (its line) when another process does."""
        verdict, line = self.check()
        if verdict == FOREIGN:
            raise EngineError(line or f"port {self.port} is held by another process")
        return verdict == OURS

    def trusted(self) -> bool:
        now = time.monotonic()
        if self._checked_at is None or now - self._checked_at >= self.recheck_s:
            self._checked_at = now
            try:
                verdict, line = self.check()
            except OSError:
                return self._trusted  # EMFILE and such: the last verdict holds until a look succeeds
            self._trusted = verdict == OURS
            if verdict == FOREIGN and not self._said and self._say is not None:
                self._say(f"gpushare-tui: {line}; its readings are ignored")
            self._said = verdict == FOREIGN
        return self._trusted
