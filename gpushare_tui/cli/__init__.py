"""The gpushare-tui command line.

`entrypoint` (the console script, `python -m gpushare_tui`) serves a headless snapshot
(`--once [--json] [--gpu-key KEY]`, cli/once.py) without importing typer, and hands every
other command line to the typer application (cli/typer_app.py). Errors are one line on stderr:
exit 2 for a UsageError (invalid input), 1 for any other GpushareError, 128 + the signal's number
for a start-up that a termination signal cut short. Our own arguments (those before `--`) must be
text: an invalid UTF-8 byte in one is a UsageError before any command sees it (`check_argv_text`);
the engine's argv after `--` passes through as bytes.

This module imports nothing of the package at its top: the entry point guards the termination
signals (core/host/lifecycle.guard_startup) before the first import of the rest, so a signal at any
moment of the start-up ends the command in order, never with a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

TYPE_CHECKING = False  # typing's, without importing typing: --once starts without it (issue 28)

if TYPE_CHECKING:
    from .once import once_report

__all__ = ["entrypoint", "main", "once_report"]
INTERRUPTED = 130  # common.ExitCode.INTERRUPTED, without importing it (and what it imports) first


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        from ..core.host.errors import GpushareError

        try:
            from .common import check_argv_text

            check_argv_text(args)
            from .once import headless_args, print_once

            headless = headless_args(args)
            if headless is not None:
                return print_once(*headless)
            from .typer_app import run_app

            return run_app(args)
        except GpushareError as e:
            from .common import report_error

            return report_error(e)
    except KeyboardInterrupt:  # a Ctrl+C before a command took over its signals: nothing was started
        return INTERRUPTED
    except Exception as e:
        # The start-up guard's SystemExit (or a Ctrl+C's KeyboardInterrupt) raised where the interpreter wraps
        # what is raised: a signal during an import that defines a class calling __set_name__ (Python 3.11:
        # "RuntimeError: Error calling __set_name__", seen in pydantic's import under typer) is still that signal
        signalled = _termination_in(e)
        if signalled is None:
            raise
        return INTERRUPTED if isinstance(signalled, KeyboardInterrupt) else _exit_code(signalled)


def _termination_in(e: BaseException) -> SystemExit | KeyboardInterrupt | None:
    """The SystemExit or KeyboardInterrupt that `e` was raised from (its causes and contexts), if any."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, (SystemExit, KeyboardInterrupt)):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _exit_code(e: SystemExit) -> int:
    return e.code if isinstance(e.code, int) else 1


def entrypoint() -> None:
    """Console script: the termination signals guarded first, then exit with `main()`'s code."""
    from ..core.host import lifecycle

    lifecycle.guard_startup()
    try:
        code = main()
    finally:  # a SystemExit (a signal's) too: the interpreter's exit would put the default (death) back
        lifecycle.ignore_termination()
    sys.exit(code)


def __getattr__(name: str) -> object:
    if name == "once_report":
        from .once import once_report

        return once_report
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
