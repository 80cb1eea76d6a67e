"""`gpushare-tui logs ENGINE`: a managed engine's log (the file its control socket's `status`
names), its last lines and, with -f, what is appended (core/host/logtail.py). ENGINE is a pid or a
name (cli/common.engine_ref)."""

from __future__ import annotations

import os
import select
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import typer

from ..core.host.budgets import LOG_FOLLOW_READ_MAX_BYTES, LOG_OUTPUT_MAX_BYTES, LOG_TAIL_MAX_BYTES
from ..core.host.errors import GpushareError, UsageError
from .common import engine_ref
from .options import ENGINE_HELP, EngineKeyOpt, EngineSlotOpt, complete_engine

if TYPE_CHECKING:
    from ..core.pacing.control import Target

FOLLOW_POLL_S = 0.25
DEFAULT_LINES = 10
# "-n -1" is a value to reject, not an unknown option
CONTEXT = {"ignore_unknown_options": True}


def logs(
    engine: str = typer.Argument(
        ...,
        metavar="ENGINE",
        help=f"A managed engine (`run`, `launch`, `synth`, `up`, `demo`). {ENGINE_HELP}",
        autocompletion=complete_engine,
    ),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Then print lines as they are appended, until Ctrl+C or the engine exits."
    ),
    lines: str = typer.Option(
        str(DEFAULT_LINES), "--lines", "-n", metavar="N", help="How many last lines to print (>= 0)."
    ),
    slot: int | None = EngineSlotOpt,
    gpu_key: str | None = EngineKeyOpt,
) -> None:
    """Print a managed engine's log: its last lines (like tail), then with -f what follows."""
    n = parse_lines(lines)
    ref = engine_ref(engine, slot, gpu_key)
    pid = ref.pid
    path = engine_log(pid, ref.target)
    try:
        if follow:
            _follow(pid, path, n)
        else:
            from ..core.host.logtail import tail_lines

            _print(tail_lines(path, n, LOG_TAIL_MAX_BYTES))
    except GpushareError as e:  # the path in it came from the engine
        from ..core.host.text import printable

        raise GpushareError(f"engine {pid}: {printable(str(e))}") from None
    except BrokenPipeError:  # `logs PID | head`: the reader is gone, which is no error
        _drop_output()


def _drop_output() -> None:
    """Send what is left of stdout (its buffer, flushed at exit) nowhere."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (GNU `tail -f` checks so too: a
    follower with nothing new to write would otherwise never notice `| head` has ended)."""
    poller = select.poll()
    poller.register(sys.stdout.fileno(), 0)  # POLLERR and POLLHUP are reported anyway
    return any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0))


def parse_lines(text: str) -> int:
    """The --lines value: an integer >= 0; UsageError otherwise."""
    try:
        n = int(text.strip())
    except ValueError:
        n = -1
    if n < 0:
        raise UsageError(f"invalid --lines {text!r}: an integer >= 0")
    return n


def engine_log(pid: int, target: Target | None = None) -> str:
    """The log file engine `pid` (the one `target` picks, when it serves several) reports;
    ControlError if it is not managed (or not there), GpushareError if it reports none."""
    from ..core.pacing.control import reported_log, request

    return reported_log(pid, request(pid, "status", target=target))


def _print(lines: Iterable[str], max_bytes: int = LOG_OUTPUT_MAX_BYTES) -> None:
    """The lines for a terminal, at most `max_bytes` of them (UTF-8) per call: a log another
    process writes (a hole of NULs, a line of tabs) never makes us print without bound."""
    from ..core.host.logtail import display_line
    from .common import error_line

    written = 0
    for line in lines:
        text = display_line(line) + "\n"
        written += len(text.encode("utf-8", "surrogateescape"))
        if written > max_bytes:
            sys.stdout.flush()
            error_line(f"output cut at {max_bytes} bytes (the log's lines are longer than a terminal shows)")
            break
        sys.stdout.write(text)
    sys.stdout.flush()


def _follow(pid: int, path: str, n: int) -> None:
    """Print the last `n` lines, then what is appended, until Ctrl+C (quietly) or the engine exits."""
    import psutil

    from ..core.host.logtail import LogFollower
    from ..core.host.text import printable
    from .common import error_line

    try:
        engine: psutil.Process | None = psutil.Process(pid)
    except psutil.Error:
        engine = None
    try:
        with LogFollower(path, n, max_read_bytes=LOG_FOLLOW_READ_MAX_BYTES) as log:
            _print(log.first_lines())
            while True:
                alive = _alive(engine)
                up = log.poll()
                if up.truncated:
                    error_line(f"log {printable(path)} truncated: following it from its start")
                if up.skipped_bytes:
                    error_line(f"log {printable(path)}: {up.skipped_bytes} bytes skipped (written faster than read)")
                if up.rotated:
                    error_line(f"log {printable(path)} replaced: following the new file")
                _print(up.lines)
                if not alive and not up.more:
                    _print(log.flush())
                    error_line(f"engine {pid} exited")
                    return
                if _reader_gone():
                    _drop_output()
                    return
                if not up.more:
                    time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        return


def _alive(proc) -> bool:
    """Whether the engine still runs (a zombie does not; a new process with its pid is not it)."""
    import psutil

    try:
        return proc is not None and proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
