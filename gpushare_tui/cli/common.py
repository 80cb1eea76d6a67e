"""What every command shares and the headless path needs too: exit codes, the one-line error
report, and the checks of common option values. Imports no typer (see cli/__init__.py)."""

from __future__ import annotations

import enum
import math
import sys

from ..core.host.errors import GpushareError, Interrupted, UsageError
from ..core.registry import abi
from ..dashboard import MIN_INTERVAL_S

TYPE_CHECKING = False  # typing's, without importing typing: --once starts without it (issue 28)
if TYPE_CHECKING:
    from ..core.pacing.control import EngineRef


class ExitCode(enum.IntEnum):
    OK = 0
    ERROR = 1  # a GpushareError at run time
    USAGE = 2  # a UsageError: invalid input, nothing done
    INTERRUPTED = 130


def error_line(msg: str) -> None:
    """`gpushare-tui: <msg>` on stderr: how every error reaches the user. An error may quote
    untrusted text (a peer's name, an engine's reply, a log's tail): each line is made printable."""
    from ..core.host.text import printable

    text = "\n".join(printable(line.expandtabs()) for line in msg.split("\n"))
    print(f"gpushare-tui: {text}", file=sys.stderr, flush=True)


def report_error(e: GpushareError) -> int:
    """Show `e` (one line, then an engine log's tail if it has one); its exit code (an
    Interrupted start-up's: 128 + the signal's number)."""
    if isinstance(e, Interrupted):
        error_line(str(e))
        return e.exit_code
    error_line(str(e) + (f"\n--- last lines of the engine log ---\n{e.log_tail}" if e.log_tail else ""))
    return ExitCode.USAGE if isinstance(e, UsageError) else ExitCode.ERROR


def check_argv_text(args: list[str]) -> None:
    """UsageError naming the first of our own arguments (those before `--`) that is not valid UTF-8.

    Python hands argv bytes that do not decode as lone surrogates (surrogateescape); every name,
    key, path and value we take is text, so such a word is refused here, once, before a command
    encodes it (a name check, a socket path, an error line) and fails deep inside. The engine's
    own argv after `--` is not ours: it passes through to the engine byte for byte (`run`'s and `launch`'s
    engine command may start without `--`; one whose arguments are not text is told to put it after one)."""
    engine_first = bool(args) and args[0] in ("run", "launch")
    for i, arg in enumerate(args, 1):
        if arg == "--":
            return
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raw = arg.encode("utf-8", "surrogateescape")
            hint = " (an engine's own arguments may be any bytes after `--`)" if engine_first else ""
            raise UsageError(f"argument {i} is not valid UTF-8 text: {raw!r}{hint}") from None


def checked_key(key: str | None) -> str | None:
    """A valid --gpu-key, or None; BadKeyError (a UsageError) otherwise."""
    return None if key is None else abi.validate_gpu_key(key)


def resolve_key(gpu_key: str | None, gpu: int | None) -> str:
    """--gpu-key wins; else the NVML UUID of --gpu (default 0). GpuKeyError without NVML or such a GPU."""
    if gpu_key is not None:
        return abi.validate_gpu_key(gpu_key)
    from ..core.observe.gpu import gpu_key_for_index

    return gpu_key_for_index(gpu or 0)


def checked_group(group: str | None) -> str | None:
    """A --share-group that names a group here (or a numeric gid), or None; UnknownGroupError otherwise."""
    if group is not None:
        from ..core.registry.segment import resolve_group

        resolve_group(group)
    return group


def checked_interval(seconds: float) -> float:
    """A dashboard refresh interval: finite and at least MIN_INTERVAL_S."""
    if not math.isfinite(seconds) or seconds < MIN_INTERVAL_S:
        raise UsageError(f"invalid --interval {seconds}: at least {MIN_INTERVAL_S} seconds")
    return seconds


def engine_ref(engine: str, slot: int | None = None, gpu_key: str | None = None) -> EngineRef:
    """The engine an ENGINE argument names (a pid, or a managed engine's unique name:
    core/pacing/control.resolve_engine), with --slot/--gpu-key picking one of a pid's several engines."""
    from ..core.pacing.control import Target, resolve_engine

    given = Target(slot=slot, gpu_key=gpu_key) if slot is not None or gpu_key is not None else None
    return resolve_engine(engine, given)


PROGRESS_EVERY_S = 5.0  # on a terminal, a line this often while a model loads


class WaitProgress:
    """A wait's progress for a person, on stderr (a core/engines/spawn.Progress callback): on a terminal a line
    every PROGRESS_EVERY_S, `waiting for WHAT (12 s of 600 s)`; terminal or not, one line once ready,
    `ready after 3.2 s (waited for WHAT)`. Nothing else: a log or a pipe is not filled with lines."""

    def __init__(self, on_terminal: bool | None = None, every_s: float = PROGRESS_EVERY_S) -> None:
        self._on_terminal = sys.stderr.isatty() if on_terminal is None else on_terminal
        self._every_s = every_s
        self._next_s = every_s

    def __call__(self, what: str, waited_s: float, allowed_s: float, ready: bool) -> None:
        if ready:
            error_line(f"ready after {waited_s:.1f} s (waited for {what})")
        elif self._on_terminal and waited_s >= self._next_s:
            self._next_s = waited_s + self._every_s
            error_line(f"waiting for {what} ({waited_s:.0f} s of {allowed_s:g} s)")
