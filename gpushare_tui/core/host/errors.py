"""The one exception base of gpushare-tui.

Every error this package reports to its user derives from GpushareError: `str(e)` is
one line that says what is wrong (and, where there is one, the fix). UsageError marks
input that is invalid (a weight, a key, a group, an option value) as opposed to a
failure at run time; the command line exits 2 for it and 1 for any other GpushareError.
"""

from __future__ import annotations


class GpushareError(Exception):
    """A failure with a one-line, user-facing reason. `log_tail`: the last lines of a log
    that tell more (an engine's, on a failed start), or ""."""

    log_tail: str = ""


class UsageError(GpushareError):
    """Invalid input from the user (or the caller): nothing was done."""


class ControlError(GpushareError, RuntimeError):
    """A control socket that cannot be set up or reached, or a request it refused; also a per-user
    directory (runtime, state: core/host/paths.py) that cannot be used."""


class EngineError(GpushareError, RuntimeError):
    """A launch failure with a one-line reason (and optionally the engine log's tail)."""

    def __init__(self, msg: str, log_tail: str = "") -> None:
        super().__init__(msg)
        self.log_tail = log_tail


class EngineFinished(EngineError):
    """The engine exited with code 0 before it was ready: it ran and finished (`echo hello`), which is no
    failure, though it was never paced (it never joined). `run` exits 0 with this line."""


class Interrupted(GpushareError):
    """A start-up cut short by a termination signal (`signum`, once the command knows it): what was
    started is stopped, and no log tail is shown (nothing failed). Exit 128 + signum."""

    def __init__(self, msg: str, signum: int | None = None) -> None:
        super().__init__(msg)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or 2)  # SIGINT's when not known: the shell's code for a Ctrl+C
