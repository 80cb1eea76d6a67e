"""Signals and process exit: how each process of gpushare-tui ends in order when it is told to.

Two ways a signal reaches the code, one helper each:
- `on_signals(handler)`: `handler(signum)` runs in the main thread on SIGTERM/SIGINT/SIGHUP
  (or the signals given), whatever that thread is blocked in. It sets a flag its loops check
  (`run`'s supervisor) or raises, so `finally` blocks run: `raise_exit` (the synthetic engine,
  `exit_on_termination`), KeyboardInterrupt (`serve`), the demo's own.
- `SignalWakeup`: for a select loop whose handlers only set flags (`up`): its `fd` becomes
  readable on every signal, so the loop sees the flag at once.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_deferring = 0  # depth of termination_deferred() sections in the main thread
_pending: list[int] = []


def on_signals(
    handler: Callable[[int], None], signals: tuple[signal.Signals, ...] = TERMINATION_SIGNALS
) -> Callable[[], None]:
    """Run `handler(signum)` (in the main thread) on each of `signals`, from now on. Returns a
    function that puts the previous handlers back."""
    previous = {sig: signal.signal(sig, lambda signum, _frame: handler(signum)) for sig in signals}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


def raise_exit(signum: int) -> None:
    """A handler: SystemExit(128 + signum), so `finally`/context managers run (leave, SIGCONT);
    inside a termination_deferred() section, once it ends."""
    if _deferring:
        _pending.append(signum)
        return
    raise SystemExit(128 + signum)


def exit_on_termination() -> Callable[[], None]:
    """`raise_exit` on SIGTERM/SIGHUP (SIGINT stays a KeyboardInterrupt); the restore function."""
    return on_signals(raise_exit, (signal.SIGTERM, signal.SIGHUP))


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


class SignalWakeup:
    """A select loop's wake-up, in the main thread: `fd` becomes readable whenever a signal with a
    Python handler arrives (signal.set_wakeup_fd). `drain()` it after each select; `close()` puts
    the previous wakeup fd back."""

    def __init__(self) -> None:
        self.fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._previous = signal.set_wakeup_fd(self._write_fd)

    def drain(self) -> None:
        try:
            os.read(self.fd, 512)
        except BlockingIOError:
            pass

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous)
        os.close(self.fd)
        os.close(self._write_fd)
