"""Reading an engine's log: its last lines, then what is appended (`tail -n N -F`), UI-free;
the one reader of a log's tail (`logs`, the dashboard's log pane, the tail an error carries).

The path comes from another process (an engine's `status` reply), so a log is opened with
O_NOFOLLOW | O_NONBLOCK and must be a regular file: a symbolic link, a FIFO or a device is
refused instead of being followed or blocking forever. Lines are decoded as UTF-8 (invalid
bytes replaced) and returned without their newline (nor a CR before it); they are NOT made
printable here (callers showing them on a terminal pass them through `core.text.printable`).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from .errors import GpushareError
from .text import printable

CHUNK_BYTES = 64 * 1024
MAX_LINE_BYTES = 64 * 1024  # a longer line (no newline yet) is returned in pieces of this size
POLL_READ_BYTES = 1024 * 1024  # one poll reads at most this much (without max_read_bytes: the rest next poll)
TAIL_TEXT_LINES = 15  # an error message's log tail: this many lines, within the last TAIL_TEXT_BYTES
TAIL_TEXT_BYTES = 16 * 1024


class LogError(GpushareError):
    """A log that cannot be read; the message names the path and why."""


def display_line(line: str) -> str:
    """A log line for a terminal: tabs expanded, every other control character replaced."""
    return printable(line.expandtabs())


def open_log(path: str) -> int:
    """A read-only, non-blocking descriptor of the regular file `path` (not followed if it is a
    symbolic link); LogError (one line) otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise LogError(f"log file {path} does not exist") from None
        if e.errno == errno.ELOOP:
            raise LogError(f"log {path} is a symbolic link (not followed)") from None
        raise LogError(f"cannot read log file {path}: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as e:
        os.close(fd)
        raise LogError(f"cannot read log file {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise LogError(f"log {path} is not a regular file")
    return fd


def _decode(line: bytes) -> str:
    return line.removesuffix(b"\r").decode("utf-8", errors="replace")


def _pread_all(fd: int, start: int, end: int) -> bytes:
    """Bytes [start, end) of `fd` (fewer if the file shrank meanwhile)."""
    parts: list[bytes] = []
    pos = start
    while pos < end:
        b = os.pread(fd, min(CHUNK_BYTES, end - pos), pos)
        if not b:
            break
        parts.append(b)
        pos += len(b)
    return b"".join(parts)


def _tail_start(fd: int, size: int, n: int, max_bytes: int | None) -> int:
    """Where the last `n` lines of the first `size` bytes begin (a last line without a newline
    counts as one), scanning backwards; at most `max_bytes` back (then at a line start)."""
    floor = 0 if max_bytes is None else max(0, size - max_bytes)
    if n <= 0:
        return size
    newlines = 0
    # a final newline ends the last line; it does not start another one
    end_skip = 1 if size > floor and os.pread(fd, 1, size - 1) == b"\n" else 0
    scan_end = size - end_skip
    while scan_end > floor:
        lo = max(floor, scan_end - CHUNK_BYTES)
        chunk = os.pread(fd, scan_end - lo, lo)
        i = len(chunk)
        while (i := chunk.rfind(b"\n", 0, i)) >= 0:
            newlines += 1
            if newlines == n:
                return lo + i + 1
        scan_end = lo
    if floor == 0 or os.pread(fd, 1, floor - 1) == b"\n":
        return floor
    cut = _pread_all(fd, floor, size).find(b"\n")  # cut by max_bytes: drop the partial first line
    return size if cut < 0 else floor + cut + 1


def _lines_between(fd: int, start: int, end: int, *, final: bool) -> Iterator[str]:
    """The lines of bytes [start, end), read a chunk at a time (never all at once); a last line
    without its newline only when `final` (a line longer than MAX_LINE_BYTES comes in pieces)."""
    pending = b""
    pos = start
    while pos < end:
        chunk = os.pread(fd, min(CHUNK_BYTES, end - pos), pos)
        if not chunk:
            break
        pos += len(chunk)
        *done, pending = (pending + chunk).split(b"\n")
        yield from (_decode(b) for b in done)
        while len(pending) >= MAX_LINE_BYTES:
            yield _decode(pending[:MAX_LINE_BYTES])
            pending = pending[MAX_LINE_BYTES:]
    if final and pending:
        yield _decode(pending)


def tail_lines(path: str, n: int, max_bytes: int | None = None) -> Iterator[str]:
    """The last `n` lines of the log at `path`, a final line without a newline included
    (`tail -n N`), read as they are consumed; with `max_bytes`, only lines within its last
    `max_bytes`. LogError if the log cannot be opened or read."""
    fd = open_log(path)
    try:
        size = os.fstat(fd).st_size
        yield from _lines_between(fd, _tail_start(fd, size, n, max_bytes), size, final=True)
    except OSError as e:
        raise LogError(f"cannot read log file {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def tail_text(path: str, n: int = TAIL_TEXT_LINES, max_bytes: int = TAIL_TEXT_BYTES) -> str:
    """For an error message (an engine that failed to start): the last `n` non-blank lines within
    the last `max_bytes` of the log at `path`, without trailing blanks, joined by newlines; "" if
    it cannot be read."""
    try:
        lines = deque((s for line in tail_lines(path, sys.maxsize, max_bytes) if (s := line.rstrip())), maxlen=n)
    except LogError:
        return ""
    return "\n".join(lines)


@dataclass
class Update:
    """What `LogFollower.poll` found: new complete lines, and whether the file was truncated or
    replaced (rotated) since the last poll (it is then followed from its start)."""

    lines: list[str] = field(default_factory=list)
    truncated: bool = False
    rotated: bool = False
    skipped_bytes: int = 0  # appended bytes not read (more than max_read_bytes at once)
    more: bool = False  # more was appended than one poll reads (POLL_READ_BYTES): poll again now


class LogFollower:
    """Follows the log at `path` by name (`tail -F`): `first_lines()` are its last `n` complete
    lines when opened; each `poll()` returns the complete lines appended since. A final line without
    its newline is held back until it ends (or `flush()`). Truncation restarts from the file's
    start; a new file at the path (rotation) is followed once the old one is read to its end.
    `max_read_bytes` bounds the reading of one poll (and of `first_lines`): when more was appended,
    only the last `max_read_bytes` are read. LogError if the log cannot be opened."""

    def __init__(self, path: str, n: int, *, max_read_bytes: int | None = None) -> None:
        self.path = path
        self.max_read_bytes = max_read_bytes
        self._fd = open_log(path)
        try:
            st = os.fstat(self._fd)
            self._id = (st.st_dev, st.st_ino)
            end = self._complete_end(st.st_size)
            self._first = (_tail_start(self._fd, end, n, max_read_bytes), end)
        except OSError as e:
            os.close(self._fd)
            raise LogError(f"cannot read log file {path}: {e.strerror or e}") from None
        self._offset = end
        self._pending = b""

    def first_lines(self) -> Iterator[str]:
        """The last `n` complete lines there were when the log was opened, read as they are
        consumed (once, before the first `poll`)."""
        try:
            yield from _lines_between(self._fd, *self._first, final=False)
        except OSError as e:
            raise LogError(f"cannot read log file {self.path}: {e.strerror or e}") from None

    def _complete_end(self, size: int) -> int:
        """The end of the last complete line within the first `size` bytes (bounded scan)."""
        pos = size
        while pos > 0:
            lo = max(0, pos - CHUNK_BYTES)
            chunk = os.pread(self._fd, pos - lo, lo)
            i = chunk.rfind(b"\n")
            if i >= 0:
                return lo + i + 1
            if size - lo >= MAX_LINE_BYTES:
                return size  # one very long line: it is returned in pieces from here on
            pos = lo
        return 0

    def poll(self) -> Update:
        """Complete lines appended since the last poll (at most POLL_READ_BYTES of them: `more`
        says when to poll again at once). LogError if the file cannot be read
        any more (an unreadable replacement is waited for instead)."""
        up = Update()
        try:
            self._read_new(up)
            replaced = None if up.more else self._replacement()
            if replaced is not None:
                self._read_new(up)  # the old file's last lines first
                if up.more:
                    os.close(replaced[0])  # switched to at a later poll
                else:
                    up.lines += self._split(final=True)
                    os.close(self._fd)
                    self._fd, self._id = replaced
                    self._offset = 0
                    up.rotated = True
                    self._read_new(up)
        except OSError as e:
            raise LogError(f"cannot read log file {self.path}: {e.strerror or e}") from None
        return up

    def _read_new(self, up: Update) -> None:
        size = os.fstat(self._fd).st_size
        if size < self._offset:
            up.truncated = True
            self._offset, self._pending = 0, b""
        if self.max_read_bytes is not None and size - self._offset > self.max_read_bytes:
            start = size - self.max_read_bytes
            up.skipped_bytes += start - self._offset
            data = _pread_all(self._fd, start, size)
            self._offset = start + len(data)
            cut = data.find(b"\n")  # the line cut at `start` is dropped (with what was held back)
            self._pending, data = b"", data[cut + 1 :] if cut >= 0 else data
        else:
            data = _pread_all(self._fd, self._offset, min(size, self._offset + POLL_READ_BYTES))
            self._offset += len(data)
        up.more = self._offset < size
        self._pending += data
        up.lines += self._split()

    def _split(self, final: bool = False) -> list[str]:
        *done, rest = self._pending.split(b"\n")
        lines = [_decode(b) for b in done]
        while len(rest) >= MAX_LINE_BYTES:
            lines.append(_decode(rest[:MAX_LINE_BYTES]))
            rest = rest[MAX_LINE_BYTES:]
        if final and rest:
            lines.append(_decode(rest))
            rest = b""
        self._pending = rest
        return lines

    def _replacement(self) -> tuple[int, tuple[int, int]] | None:
        """(fd, id) of a different regular file now at the path, else None (also while the path
        is missing or unreadable: the old file is still followed)."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return None
        if (st.st_dev, st.st_ino) == self._id or not stat.S_ISREG(st.st_mode):
            return None
        try:
            fd = open_log(self.path)
        except LogError:
            return None
        st = os.fstat(fd)
        return fd, (st.st_dev, st.st_ino)

    def flush(self) -> list[str]:
        """The held-back final line without its newline, if any (when following ends)."""
        return self._split(final=True)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
