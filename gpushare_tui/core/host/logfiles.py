"""Engine log files over many runs: each run's start is marked in its log (a line with the time, so `logs -f NAME`
shows the runs apart), a log that has grown past budgets.LOG_ROTATE_BYTES is moved aside when a run starts on it
(one older generation kept: LOG.1), and of the one-file-per-run logs of one engine name (`run`, `launch`) at most
budgets.LOG_FILES_PER_NAME_MAX are kept: older ones go unless a process still has them open.

The engine writes its log as it likes (outside input): the bounds hold at each start, never by cutting a run's own
output while it is written."""

from __future__ import annotations

import os
import re
import time

from . import budgets, paths

RUN_MARK = "--- gpushare-tui: "  # what starts a run's first line in its log


def run_mark(what: str, pid: int | None, now_s: float) -> str:
    """The line that starts a run in its log: `--- gpushare-tui: chat started 2026-12-06 05:25:46 UTC (pid 123) ---`
    (`what` is text of ours: a name checked by declaration.check_name, or made printable by the caller)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(now_s))
    by = f" (pid {pid})" if pid is not None else ""
    return f"{RUN_MARK}{what} started {when} UTC{by} ---\n"


def begin_run(path: str, what: str, pid: int | None, now_s: float) -> None:
    """Ready the log at `path` for a new run: moved to `path`.1 first when it is LOG_ROTATE_BYTES or longer, then
    the run's mark appended (paths.open_log: never through a link). UntrustedPathError as open_log's."""
    try:
        if os.lstat(path).st_size >= budgets.LOG_ROTATE_BYTES:
            os.replace(path, path + ".1")
    except FileNotFoundError:
        pass
    fd = paths.open_log(path)
    try:
        os.write(fd, run_mark(what, pid, now_s).encode())
    finally:
        os.close(fd)


def family(prefix: str, suffix: str = ".log") -> re.Pattern[str]:
    """The file names of one engine name's per-run logs: `prefix`, digits and dashes, `suffix` (`chat-` matches
    chat-123.log and chat-8080.log, never chat-big-123.log)."""
    return re.compile(re.escape(prefix) + r"[0-9]+(?:-[0-9]+)*" + re.escape(suffix))


def surplus(files: list[tuple[str, float]], keep: int) -> list[str]:
    """Of `files` (name, mtime), those beyond the `keep` most recently modified, oldest last (pure)."""
    newest_first = sorted(files, key=lambda f: (f[1], f[0]), reverse=True)
    return [name for name, _ in newest_first[keep:]]


def collect(directory: str, pattern: re.Pattern[str], keep: int = budgets.LOG_FILES_PER_NAME_MAX) -> list[str]:
    """Remove the logs in `directory` whose names `pattern` matches beyond the `keep` newest, except those a process
    still has open (a running engine's); the paths removed. Never raises: a log that cannot go stays."""
    try:
        with os.scandir(directory) as it:
            found = [(e.name, e.stat(follow_symlinks=False)) for e in it if pattern.fullmatch(e.name)]
    except OSError:
        return []
    regular = [(name, st.st_mtime) for name, st in found if _is_plain_file(st)]
    extra = surplus(regular, keep)
    if not extra:
        return []
    held = open_files()
    removed = []
    for name in extra:
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
            if (st.st_dev, st.st_ino) in held:
                continue
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    return removed


def _is_plain_file(st: os.stat_result) -> bool:
    import stat

    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def open_files() -> set[tuple[int, int]]:
    """(st_dev, st_ino) of every file our processes (those whose /proc/PID/fd we may read) have open."""
    held: set[tuple[int, int]] = set()
    try:
        pids = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return held
    for pid in pids:
        try:
            with os.scandir(f"/proc/{pid}/fd") as it:
                for e in it:
                    try:
                        st = os.stat(e.path)
                    except OSError:
                        continue
                    held.add((st.st_dev, st.st_ino))
        except OSError:
            continue
    return held
