"""The watchdog that continues an engine's whole process group when its supervisor dies, by any
means (SIGKILL included). PR_SET_PDEATHSIG reaches only the engine itself: a worker it started
(vLLM's, SGLang's) stopped at that instant would stay stopped for ever.

`start(pgid)` runs this file as a script (`python -I -S watchdog.py PGID`: it imports nothing
of ours, ~10 MB) in a session of its own (a terminal's signals never reach it), its stdin the
read end of a pipe whose only write end the supervisor holds. It blocks on that pipe (no
polling): end of file means the supervisor is gone, and it sends SIGCONT to the group; a `q`
line means the supervisor ended the engine in order, and it exits without a signal. Until an `r`
line (the engine is ready and joined: `Watchdog.ready()`) the supervisor's death also ends the
group (SIGTERM, SIGKILL after END_GRACE_S): an engine still loading serves no one, nobody was
told of it, and it would run on unpaced for ever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

QUIT = b"q\n"
READY = b"r\n"
REAP_S = 2.0
END_GRACE_S = 10.0  # as the supervisor's own STOP_GRACE_S: SIGTERM, then SIGKILL


class Watchdog:
    """The supervisor's end: `close()` after the engine was ended in order (idempotent)."""

    def __init__(self, proc: subprocess.Popen, write_fd: int) -> None:
        self.proc, self._fd = proc, write_fd

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ready(self) -> None:
        """The engine is ready and joined: from now on the supervisor's death only continues the group."""
        if self._fd >= 0:
            try:
                os.write(self._fd, READY)
            except OSError:
                pass

    def close(self, continue_group: bool = False) -> None:
        """Tell it to exit (`continue_group`: SIGCONT the group first, as on the supervisor's death) and reap it."""
        if self._fd < 0:
            return
        try:
            if not continue_group:
                os.write(self._fd, QUIT)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = -1
        try:
            self.proc.wait(REAP_S)
        except subprocess.TimeoutExpired:
            pass


def start(pgid: int) -> Watchdog:
    """The watchdog of process group `pgid`; OSError if it cannot be started."""
    read_fd, write_fd = os.pipe()  # both non-inheritable: only the watchdog's stdin gets the read end
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(pgid)],
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
    return Watchdog(proc, write_fd)


def main(argv: list[str]) -> int:
    pgid = int(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    data = b""
    while True:
        try:
            chunk = os.read(0, 64)
        except InterruptedError:
            continue
        if not chunk:
            break  # the supervisor is gone (its write end closed with it)
        data += chunk
        if data.endswith(QUIT):
            return 0
    _signal_group(pgid, signal.SIGCONT)
    if READY not in data:  # still loading: end it
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + END_GRACE_S
        while _signal_group(pgid, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_group(pgid, signal.SIGKILL)
    return 0


def _signal_group(pgid: int, sig: int) -> bool:
    """`sig` to the group; whether it still exists."""
    try:
        os.killpg(pgid, sig)
    except OSError:
        return False  # the group is gone
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv))
