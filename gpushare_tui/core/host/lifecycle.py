"""Signals and process exit: how each process of gpushare-tui ends in order when it is told to.

Two ways a signal reaches the code, one helper each:
- `on_signals(handler)`: `handler(signum)` runs in the main thread on SIGTERM/SIGINT/SIGHUP
  (or the signals given), whatever that thread is blocked in. It sets a flag its loops check
  (`Termination`: `run`, `launch`; `up`'s own) or raises, so `finally` blocks run: `raise_exit`
  (the start-up guard, the synthetic engine), KeyboardInterrupt (`serve`), the demo's own.
- `SignalWakeup`: for a select loop whose handlers only set flags (`up`): its `fd` becomes
  readable on every signal, so the loop sees the flag at once.

Inside a `termination_deferred()` section (a slot claimed but not yet written, a child started but
not yet recorded, a thread being started) every such handler waits until the section ends, so an
exception a handler raises never cuts that section in half. The command line installs
`guard_startup()` before it imports anything else, and `ignore_termination()` once it is done:
from its first line to its last, a termination signal ends it in order, never with a traceback.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
Handler = Callable[[int], None]

_deferring = 0  # depth of termination_deferred() sections in the main thread
_pending: list[tuple[Handler, int]] = []  # (handler, signum) that came during one
# A termination signal the start-up guard raised for. Its exception may not end the start-up: raised inside an
# import, it can come out of a library's `except Exception` fallback as if nothing happened (Python 3.11 wraps an
# exception raised in a class body's __set_name__ in a RuntimeError; `run` then started and served on, told to
# stop by nobody). The next handler installed is given it at once.
_guarded_signum: int | None = None


def on_signals(handler: Handler, signals: tuple[signal.Signals, ...] = TERMINATION_SIGNALS) -> Callable[[], None]:
    """Run `handler(signum)` (in the main thread) on each of `signals`, from now on; inside a
    termination_deferred() section, once it ends. Returns a function that puts the previous
    handlers back."""

    def call(signum: int, _frame: object) -> None:
        if _deferring:
            _pending.append((handler, signum))
            return
        handler(signum)

    global _guarded_signum
    previous = {sig: signal.signal(sig, call) for sig in signals}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    came, _guarded_signum = _guarded_signum, None
    if came is not None and handler is not _guard and sys.exc_info()[1] is None:
        handler(came)  # the start-up guard's signal, whose exception something swallowed: this handler's turn
    return restore


def raise_exit(signum: int) -> None:
    """A handler: SystemExit(128 + signum), so `finally`/context managers run (leave, SIGCONT);
    SIGINT stays what Python makes of it, a KeyboardInterrupt (a command's Ctrl+C path)."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def exit_on_termination() -> Callable[[], None]:
    """`raise_exit` on SIGTERM/SIGINT/SIGHUP; the restore function."""
    return on_signals(raise_exit)


def guard_startup() -> None:
    """The command line's first act: `raise_exit` on every termination signal until a command
    installs its own handlers (a signal meanwhile ends it before it started anything: SystemExit
    128 + signum, KeyboardInterrupt for SIGINT; never a default death half-way). Where that exception
    was swallowed on its way (an import's fallback, or Python itself where it cannot raise: a weakref
    callback in an import, printed as "Exception ignored in"), the next handler installed
    (`on_signals`) is called with the signal as it is installed, and nothing is printed of it."""
    global _unraisable_before
    if _unraisable_before is None:
        _unraisable_before = sys.unraisablehook
        sys.unraisablehook = _quiet_guard_exit
    on_signals(_guard)


_unraisable_before: Callable[[sys.UnraisableHookArgs], object] | None = None


def _quiet_guard_exit(unraisable: sys.UnraisableHookArgs) -> None:
    """sys.unraisablehook: the guard's own exit, raised where Python could not raise it, is not printed (its
    signal goes to the next handler installed); anything else as before."""
    if _guarded_signum is not None and unraisable.exc_type in (SystemExit, KeyboardInterrupt):
        return
    assert _unraisable_before is not None
    _unraisable_before(unraisable)


def _guard(signum: int) -> None:
    global _guarded_signum
    _guarded_signum = signum
    raise_exit(signum)


def ignore_termination() -> None:
    """The command line's last act, once its command returned and cleaned up: a termination signal
    now would only cut the interpreter's own exit short (a traceback from an atexit hook, another
    exit code); the process ends in a moment anyway."""
    for sig in TERMINATION_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def default_termination() -> None:
    """Python's own dispositions again (the dashboard: SIGTERM/SIGHUP end it, SIGINT is a KeyboardInterrupt)."""
    for sig in TERMINATION_SIGNALS:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


class Termination:
    """A handler for loops that check a flag: `event` is set at the first termination signal,
    `signum` is that one's number, `count` how many came."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self.count = 0

    def __call__(self, signum: int) -> None:
        self.count += 1
        if self.signum is None:
            self.signum = signum
        self.event.set()

    @property
    def exit_code(self) -> int:
        """128 + the first signal's number (the shell's code for a death by it); 130 before any."""
        return 128 + (self.signum if self.signum is not None else signal.SIGINT)


@contextmanager
def termination_deferred() -> Iterator[None]:
    """A section that a termination signal must not cut in half (a slot claimed but not yet
    written, so `leave` could not tell it is ours; a child started but not yet recorded): the
    handlers of the signals that came run when it ends. If an exception is already on its way out
    of the section, theirs are dropped (that one ends the process's work already)."""
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
                _run_pending(in_flight=sys.exc_info()[1] is not None)


def _run_pending(in_flight: bool) -> None:
    due = list(_pending)
    _pending.clear()
    for handler, signum in due:
        if not in_flight:
            handler(signum)  # may raise: the rest are moot then
            continue
        try:
            handler(signum)
        except BaseException:
            pass


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
