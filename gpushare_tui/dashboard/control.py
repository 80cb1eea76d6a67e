"""How the dashboard talks to managed engines: `LocalControl`, the real `ControlClient`
(dashboard/protocols.py) over `core.control`, for this user's sockets. It lists the sockets
without `core.control` (its types, `socket`), which it imports only to ask an engine: a host with no
managed engine (a `--once` snapshot, say) never loads it.
"""

from __future__ import annotations

from ..core.host.errors import ControlError
from ..core.pacing.sockets import socket_index

TYPE_CHECKING = False  # typing's, without importing typing: --once starts without it (issue 28)
if TYPE_CHECKING:
    from ..core.pacing.control import Target


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
