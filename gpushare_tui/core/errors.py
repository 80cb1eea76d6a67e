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
