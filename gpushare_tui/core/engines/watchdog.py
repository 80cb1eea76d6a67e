"""The watchdog that ends an engine's whole process tree when its supervisor dies, by any means
(SIGKILL included): an engine nobody paces and nobody sees (its slot ages out), holding its memory
(on a GPU, its VRAM) behind a dead public port, is an outage plus an orphan (issue 26, item 7).

`start(pgid, grace_s)` runs this file as a script (`python -I -S watchdog.py PGID GRACE_S`: it imports
nothing of ours, ~10 MB) in a session of its own (a terminal's signals never reach it), its stdin
the read end of a pipe whose only write end the supervisor holds. It blocks on that pipe (no
polling). What the supervisor writes there, one line each:

- `+PID STARTTIME`: a descendant of the engine that left its process group (`setsid`, a double
  fork), to be ended with it (`STARTTIME`, field 22 of /proc/PID/stat, guards against pid reuse);
- `q`: the supervisor ended the engine in order: exit without a signal.

End of file means the supervisor is gone: the group and the tracked pids get SIGCONT (nothing is
left stopped), then SIGTERM; whatever is still alive after GRACE_S gets SIGKILL. The engine itself
also gets SIGTERM from the kernel at that moment (PR_SET_PDEATHSIG, spawn.die_with_parent), taken
once it is continued: it ends even if this watchdog could not start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

QUIT = b"q\n"
REAP_S = 2.0
END_POLL_S = 0.1
TRACKED_MAX = 4096  # escaped descendants remembered (as activity.tree's TREE_MAX_PROCESSES)


class Watchdog:
    """The supervisor's end: `track(pid)` an escaped descendant, `close()` after the engine was ended
    in order (idempotent)."""

    def __init__(self, proc: subprocess.Popen, write_fd: int, grace_s: float) -> None:
        self.proc, self._fd, self.grace_s = proc, write_fd, grace_s
        self._tracked: set[int] = set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def track(self, pid: int) -> None:
        """End `pid` too if the supervisor dies (once per pid; a pid already gone is not sent)."""
        if self._fd < 0 or pid in self._tracked or len(self._tracked) >= TRACKED_MAX:
            return
        start = start_time(pid)
        if start is None:
            return
        self._tracked.add(pid)
        try:
            os.write(self._fd, f"+{pid} {start}\n".encode())
        except OSError:
            pass

    def close(self, end_tree: bool = False) -> None:
        """Tell it to exit (`end_tree`: end the tree first, as on the supervisor's death) and reap it."""
        if self._fd < 0:
            return
        try:
            if not end_tree:
                os.write(self._fd, QUIT)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = -1
        try:
            self.proc.wait(REAP_S + (self.grace_s if end_tree else 0.0))
        except subprocess.TimeoutExpired:
            pass


def start(pgid: int, grace_s: float) -> Watchdog:
    """The watchdog of process group `pgid`, which gives what it ends `grace_s` between SIGTERM and
    SIGKILL (the supervisor's own STOP_GRACE_S); OSError if it cannot be started."""
    read_fd, write_fd = os.pipe()  # both non-inheritable: only the watchdog's stdin gets the read end
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(pgid), repr(grace_s)],
            stdin=read_fd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    return Watchdog(proc, write_fd, grace_s)


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields from the state on (fields 3...), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].decode("ascii", "replace").split()


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, field 22): a pid and it name one process."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def _live(pid: int, start: int | None = None) -> bool:
    """Whether `pid` is a live (not zombie) process, started at `start` when given."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20 or fields[0] in ("Z", "X"):
        return False
    return start is None or int(fields[19]) == start


def _group_live(pgid: int) -> bool:
    """Whether any live process is left in group `pgid` (a zombie, unreaped by an init that does not
    reap, is not)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields is not None and len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                return True
    return False


def _signal(pgid: int, tracked: dict[int, int], sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass  # the group is gone
    for pid, start in tracked.items():
        if _live(pid, start):
            try:
                os.kill(pid, sig)
            except OSError:
                pass


def end_tree(pgid: int, tracked: dict[int, int], grace_s: float) -> None:
    """SIGCONT and SIGTERM to the group and the tracked pids; SIGKILL to what lives after `grace_s`."""
    _signal(pgid, tracked, signal.SIGCONT)
    _signal(pgid, tracked, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _group_live(pgid) and not any(_live(p, s) for p, s in tracked.items()):
            return
        time.sleep(END_POLL_S)
    _signal(pgid, tracked, signal.SIGCONT)
    _signal(pgid, tracked, signal.SIGKILL)


def main(argv: list[str]) -> int:
    pgid = int(argv[1])
    grace_s = float(argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tracked: dict[int, int] = {}
    data = b""
    while True:
        try:
            chunk = os.read(0, 4096)
        except InterruptedError:
            continue
        if not chunk:
            break  # the supervisor is gone (its write end closed with it)
        data += chunk
        *lines, data = data.split(b"\n")
        for line in lines:
            if line == QUIT.strip():
                return 0
            if line.startswith(b"+") and len(tracked) < TRACKED_MAX:
                try:
                    pid, start = (int(x) for x in line[1:].split())
                except ValueError:
                    continue
                tracked[pid] = start
        data = data[-64:]  # a line is short: nothing unbounded is kept
    end_tree(pgid, tracked, grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
