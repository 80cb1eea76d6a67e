"""How the dashboard talks to managed engines: a small client interface over `core.control`.

The App and `LiveSource` take a `ControlClient`, so tests pass a fake instead
of patching the module; `LocalControl` is the real one (this user's sockets).
"""

from __future__ import annotations

from typing import Protocol

from ..core.pacing import control


class ControlClient(Protocol):
    """Requests to engines' control sockets. Failures raise `core.control.ControlError`."""

    def request(
        self, pid: int, cmd: str, timeout_s: float = 3.0, *, target: control.Target | None = None, **args: object
    ) -> dict:
        """One request (to the engine `target` names when the pid serves several: the row's gpu key
        and slot); the reply dict (`ok` is true), or ControlError with a one-line reason."""
        ...

    def is_managed(self, pid: int) -> bool:
        """Whether `pid` has a control socket (a gpushare-tui managed engine)."""
        ...

    def socket_pids(self) -> set[int] | None:
        """Every pid with a control socket, or None when that cannot be listed (ask `is_managed`)."""
        ...


class LocalControl:
    """`core.control` for this user: sockets in the per-user runtime directory."""

    def request(
        self, pid: int, cmd: str, timeout_s: float = 3.0, *, target: control.Target | None = None, **args: object
    ) -> dict:
        return control.request(pid, cmd, timeout_s, target=target, busy_retry_s=0.0, **args)  # never waits on busy

    def is_managed(self, pid: int) -> bool:
        return control.is_managed(pid)

    def socket_pids(self) -> set[int] | None:
        # one listdir per tick instead of a stat per peer
        try:
            return set(control.socket_index())
        except control.ControlError:
            return None
