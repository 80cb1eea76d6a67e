"""Untrusted text (peer names, segment file names, engine replies) made safe for a terminal."""

from __future__ import annotations

import re
from dataclasses import replace

from ..observe.snapshot import GpuSnapshot, SegmentProblem

# C0, DEL and C1 (ESC included): anything a terminal may act on instead of print.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character replaced by U+FFFD, so a name like
    `\\x1b]2;OWNED\\x07` shows as text and never reaches the terminal as a sequence."""
    return _CONTROL.sub("\ufffd", text)


def printable_gpu(g: GpuSnapshot) -> GpuSnapshot:
    """`g` with its key, segment name and peer names printable (for terminal views only)."""
    peers = tuple(replace(p, name=printable(p.name)) for p in g.peers)
    return replace(g, gpu_key=printable(g.gpu_key), segment=printable(g.segment), peers=peers)


def printable_problem(e: SegmentProblem) -> SegmentProblem:
    return SegmentProblem(printable(e.segment), printable(e.error))


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """ "1 peer", "2 peers", "0 peers": a count and its noun, the plural when n != 1."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
