"""What the App takes, as typing Protocols: a `DataSource` of models (source.py's LiveSource and
FixedSource, remote.py's), used by one collector thread (`collect`, `close`) except `forget_status`,
which any thread may call; and a `ControlClient` to engines' control sockets (control.py's
LocalControl), so tests pass a fake instead of patching the module.

Apart from their implementations, which import them only to type-check: a one-shot report (`--once`)
imports no `typing` (issue 28).
"""

from __future__ import annotations

from typing import Protocol

from ..core.pacing.control import Target
from .model import DashboardModel


class DataSource(Protocol):
    def collect(self) -> DashboardModel:
        """The current model (may raise: the App reports it and carries on)."""
        ...

    def prime(self) -> list[DashboardModel]:
        """Models from before the App started, oldest first (the plots' history)."""
        ...

    def forget_status(self, pid: int) -> None:
        """Ask `pid`'s engine for its status again at the next collect (after a weight change or a stop)."""
        ...

    def close(self) -> None:
        """Release what the source holds; no collect follows."""
        ...


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
