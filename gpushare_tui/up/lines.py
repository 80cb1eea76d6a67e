"""Line numbers for keys of a parsed TOML file. tomllib gives them only for syntax errors, so
a key's line is found in the text: the `[[engine]]` block it belongs to, then `key =` in it.
A key that cannot be found this way (inline tables, dotted keys) has no line: None."""

from __future__ import annotations

import re

_HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\"' -]+?)\s*\]\]?\s*(#.*)?$")


def _blocks(text: str) -> list[tuple[str | None, int, int]]:
    """(table header name or None for the top, first line, last line) of each block, 1-based."""
    lines = text.splitlines()
    out: list[tuple[str | None, int, int]] = []
    name: str | None = None
    start = 1
    for i, line in enumerate(lines, 1):
        m = _HEADER.match(line)
        if m and not line.lstrip().startswith("#"):
            out.append((name, start, i - 1))
            name, start = m.group(1).strip(), i
    out.append((name, start, len(lines)))
    return out


def key_line(text: str, table: str | None, key: str | None, index: int = 0) -> int | None:
    """The line of `key` in the `index`-th block headed `table` (`[[engine]]`, `[serve]`;
    None: the top level), or of the block's header when `key` is None or not found there."""
    blocks = [b for b in _blocks(text) if b[0] == table]
    if index >= len(blocks):
        return None
    _, first, last = blocks[index]
    if key is not None:
        pat = re.compile(rf"^\s*(\"{re.escape(key)}\"|'{re.escape(key)}'|{re.escape(key)})\s*[=.]")
        lines = text.splitlines()
        for n in range(first, last + 1):
            if pat.match(lines[n - 1]):
                return n
    return first if table is not None else None
