"""Helpers for `gpushare-tui up` tests: a running `up` with its stderr collected, the slots of
its key, and every process it started ended by pid at teardown."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import psutil

from gpushare_tui.core.pacing import control
from gpushare_tui.core.registry.segment import Segment, SegmentError, shm_path
from testkit.cli import cli_argv
from testkit.wait import wait_for


def alive_slots(key: str) -> dict[str, tuple[int, float]]:
    """name -> (pid, weight) of the live slots of `key`."""
    try:
        with Segment.attach_readonly(shm_path(key)) as seg:
            now = time.time_ns() // 1000
            return {r.name: (r.pid, r.weight) for r in seg.read_slots() if r.is_alive(now)}
    except (FileNotFoundError, OSError, SegmentError):
        return {}


def used_slots(key: str) -> list[int]:
    """pids of every slot not left (pid != 0), alive or not."""
    try:
        with Segment.attach_readonly(shm_path(key)) as seg:
            return [r.pid for r in seg.read_slots() if r.pid]
    except (FileNotFoundError, OSError, SegmentError):
        return []


class UpProc:
    """`gpushare-tui up FILE` started by a test."""

    def __init__(self, procs, path: str, key: str, env: dict | None = None) -> None:
        self.path, self.key = path, key
        self.proc: subprocess.Popen = procs.start(cli_argv("up", path), env=env)
        self.lines: list[str] = []
        self.seen_pids: set[int] = set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_line(self, needle: str, timeout: float = 30, count: int = 1) -> str:
        def found() -> str | None:
            hits = [x for x in self.lines if needle in x]
            if len(hits) >= count:
                return hits[count - 1]
            if self.proc.poll() is not None:
                raise AssertionError(f"up exited {self.proc.returncode}:\n{self.text()}")
            return None

        return wait_for(found, timeout, 0.05, f"line {needle!r} x{count} in:\n{self.text()}")  # type: ignore[return-value]

    def slot(self, name: str, timeout: float = 30, not_pid: int | None = None) -> tuple[int, float]:
        def got():
            s = alive_slots(self.key).get(name)
            return s if s is not None and s[0] != not_pid else None

        pid, w = wait_for(got, timeout, 0.05, f"slot {name!r} (not pid {not_pid}); up said:\n{self.text()}")  # type: ignore[misc]
        # an engine joins, then binds its control socket: ready for requests once both are there
        wait_for(lambda: control.is_managed(pid), timeout, 0.05, f"{name!r}'s control socket (pid {pid})")
        self.seen_pids.add(pid)
        self.seen_pids |= set(self.descendants())
        return pid, w

    def descendants(self) -> list[int]:
        try:
            return [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def end(self) -> None:
        """SIGCONT + SIGKILL every process it started (engines first), then itself."""
        pids = self.seen_pids | set(self.descendants())
        for pid in pids:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break


def write(path, text: str) -> str:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return str(path)
