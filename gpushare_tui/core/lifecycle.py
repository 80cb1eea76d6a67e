"""Process-exit plumbing shared by engines and supervisors."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_deferring = 0  # depth of termination_deferred() sections in the main thread
_pending: list[int] = []


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    if _deferring:
        _pending.append(signum)
        return
    raise SystemExit(128 + signum)


def exit_on_termination() -> None:
    """Turn SIGTERM/SIGHUP into SystemExit so `finally`/context managers run (leave, SIGCONT)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)


@contextmanager
def termination_deferred() -> Iterator[None]:
    """A section that SIGTERM/SIGHUP must not cut in half (a slot claimed but not yet
    written, so `leave` could not tell it is ours): the exit is raised when it ends."""
    global _deferring
    main = threading.current_thread() is threading.main_thread()
    if main:
        _deferring += 1
    try:
        yield
    finally:
        if main:
            _deferring -= 1
            if not _deferring and _pending:
                raise SystemExit(128 + _pending.pop(0))
