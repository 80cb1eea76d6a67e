"""How the dashboard talks to managed engines: a small client interface over `core.control`.

The App and `LiveSource` take a `ControlClient`, so tests pass a fake instead
of patching the module; `LocalControl` is the real one (this user's sockets).
"""

from __future__ import annotations

import os
from typing import Protocol

from ..core import control, paths


class ControlClient(Protocol):
    """Requests to engines' control sockets. Failures raise `core.control.ControlError`."""

    def request(self, pid: int, cmd: str, timeout_s: float = 3.0, **args: object) -> dict:
        """One request; the reply dict (`ok` is true), or ControlError with a one-line reason."""
        ...

    def is_managed(self, pid: int) -> bool:
        """Whether `pid` has a control socket (a gpushare-tui managed engine)."""
        ...

    def socket_pids(self) -> set[int] | None:
        """Every pid with a control socket, or None when that cannot be listed (ask `is_managed`)."""
        ...


class LocalControl:
    """`core.control` for this user: sockets in the per-user runtime directory."""

    def request(self, pid: int, cmd: str, timeout_s: float = 3.0, **args: object) -> dict:
        return control.request(pid, cmd, timeout_s=timeout_s, **args)

    def is_managed(self, pid: int) -> bool:
        return control.is_managed(pid)

    def socket_pids(self) -> set[int] | None:
        # one listdir per tick instead of a stat per peer
        try:
            names = os.listdir(paths.runtime_dir())
        except (OSError, control.ControlError):
            return None
        return {int(n[:-5]) for n in names if n.endswith(".sock") and n[:-5].isdigit()}
