"""The gpushare-tui command line.

`entrypoint` (the console script, `python -m gpushare_tui`) serves a headless snapshot
(`--once [--json] [--gpu-key KEY]`, cli/once.py) without importing typer, and hands every
other command line to the typer application (cli/typer_app.py). Errors are one line on stderr:
exit 2 for a UsageError (invalid input), 1 for any other GpushareError. Our own arguments
(those before `--`) must be text: an invalid UTF-8 byte in one is a UsageError before any
command sees it (`check_argv_text`); the engine's argv after `--` passes through as bytes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..core.host.errors import GpushareError
from .common import check_argv_text, report_error
from .once import headless_args, once_report, print_once

__all__ = ["entrypoint", "main", "once_report"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        check_argv_text(args)
        headless = headless_args(args)
        if headless is not None:
            return print_once(*headless)
        from .typer_app import run_app

        return run_app(args)
    except GpushareError as e:
        return report_error(e)


def entrypoint() -> None:
    """Console script: exit with `main()`'s code."""
    sys.exit(main())
