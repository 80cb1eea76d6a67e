"""Untrusted text (peer names, segment file names, engine replies) made safe for a terminal."""

from __future__ import annotations

import re

# C0, DEL and C1 (ESC included): anything a terminal may act on instead of print.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character replaced by U+FFFD, so a name like
    `\\x1b]2;OWNED\\x07` shows as text and never reaches the terminal as a sequence."""
    return _CONTROL.sub("\ufffd", text)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """ "1 peer", "2 peers", "0 peers": a count and its noun, the plural when n != 1."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
