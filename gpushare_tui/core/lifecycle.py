"""Process-exit plumbing shared by engines and supervisors."""

from __future__ import annotations

import signal
from types import FrameType


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def exit_on_termination() -> None:
    """Turn SIGTERM/SIGHUP into SystemExit so `finally`/context managers run (leave, SIGCONT)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)
