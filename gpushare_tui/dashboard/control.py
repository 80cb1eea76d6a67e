"""How the dashboard talks to managed engines: a small client interface over `core.control`.

The App and `LiveSource` take a `ControlClient`, so tests pass a fake instead
of patching the module; `LocalControl` is the real one (this user's sockets). It lists the sockets
without `core.control` (its types, `socket`), which it imports only to ask an engine: a host with no
managed engine (a `--once` snapshot, say) never loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..core.host.errors import ControlError
from ..core.pacing.sockets import socket_index

if TYPE_CHECKING:
    from ..core.pacing.control import Target


class ControlClient(Protocol):
    """Requests to engines' control sockets. Failures raise `core.host.errors.ControlError`."""

    def request(
        self, pid: int, cmd: str, timeout_s: float = 3.0, *, target: Target | None = None, **args: object
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
        self, pid: int, cmd: str, timeout_s: float = 3.0, *, target: Target | None = None, **args: object
    ) -> dict:
        from ..core.pacing.control import request

        return request(pid, cmd, timeout_s, target=target, busy_retry_s=0.0, **args)  # never waits on busy

    def is_managed(self, pid: int) -> bool:
        from ..core.pacing.control import is_managed

        return is_managed(pid)

    def socket_pids(self) -> set[int] | None:
        # one listdir per tick instead of a stat per peer
        try:
            return set(socket_index())
        except ControlError:
            return None
