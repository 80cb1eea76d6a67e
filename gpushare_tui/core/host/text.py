"""Untrusted text (peer names, segment file names, engine replies) made safe for a terminal."""

from __future__ import annotations

import unicodedata

# What a terminal may act on instead of print, or that changes how the text around it reads:
# Cc: C0, DEL and C1 (ESC included); Cf: format characters (bidi overrides and isolates such as
# U+202E, zero-width space/joiners, soft hyphen, BOM); Cs: a lone surrogate (an undecodable byte,
# surrogate-escaped), which no terminal encoding can write; Zl/Zp: the line and paragraph separators.
REPLACED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
REPLACEMENT = "\ufffd"


def printable(text: str) -> str:
    """`text` with every character of REPLACED_CATEGORIES replaced by U+FFFD, so a name like
    `\\x1b]2;OWNED\\x07` shows as text and never reaches the terminal as a sequence, and a name
    with U+202E cannot reorder the row it is shown in. The one display-text rule: every terminal
    view (table, dashboard, `status`, `logs`, error lines) shows untrusted text through it."""
    if text.isprintable():  # the common case, in C: no Cc/Cf/Cs/Zl/Zp (nor any other non-printable)
        return text
    return "".join(REPLACEMENT if unicodedata.category(c) in REPLACED_CATEGORIES else c for c in text)


def escaped(text: str) -> str:
    """`text` with every character of REPLACED_CATEGORIES written as its Python escape (`\\u202e`, `\\x1b`,
    `\\udcff`): as safe on a terminal as `printable`, and unlike it one text per name, so a name listed this
    way can be typed back (`status 'ab\\u202ecd'`: core.pacing.control.resolve_engine)."""
    if text.isprintable():
        return text
    return "".join(ascii(c)[1:-1] if unicodedata.category(c) in REPLACED_CATEGORIES else c for c in text)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """ "1 peer", "2 peers", "0 peers": a count and its noun, the plural when n != 1."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
