"""One `up` per config file: it holds an exclusive lock on `<runtime dir>/up-<hash>.lock`
(the hash of the file's real path) holding its pid; `up --reload FILE` signals that pid.
The lock is opened relative to the checked runtime directory (core/host/paths.py), never through a link."""

from __future__ import annotations

import fcntl
import os
import signal

from ..core.host import paths
from ..core.host.errors import GpushareError
from ..core.host.paths import runtime_dir


def lock_path(config_path: str) -> str:
    return os.path.join(runtime_dir(), f"up-{paths.real_path_digest(config_path)}.lock")


class UpLock:
    """Held for the life of an `up`; GpushareError if another `up` holds it."""

    def __init__(self, config_path: str) -> None:
        self.path = lock_path(config_path)
        self._fd = paths.open_lock(self.path)  # in the trusted runtime directory, never through a link
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(self._fd)
            os.close(self._fd)
            raise GpushareError(
                f"an up for {config_path} is already running (pid {pid}); reload it with: "
                f"gpushare-tui up --reload {config_path}"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd >= 0:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # the lock goes with it
            self._fd = -1


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def signal_reload(config_path: str) -> int:
    """SIGHUP to the `up` running `config_path`; its pid. GpushareError when none runs."""
    path = lock_path(config_path)
    try:
        fd = paths.open_existing_lock(path)
    except FileNotFoundError:
        raise GpushareError(f"no up is running for {config_path}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            raise GpushareError(f"no up is running for {config_path}")
        except BlockingIOError:
            pid = _read_pid(fd)
    finally:
        os.close(fd)
    if pid is None:
        raise GpushareError(f"the up for {config_path} is starting; try again")
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise GpushareError(f"no up is running for {config_path}") from None
    return pid
