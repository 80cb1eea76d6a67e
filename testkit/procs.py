"""Subprocesses that never outlive a test: killed by pid (SIGCONT first, so nothing is ever left
stopped, then SIGKILL, then reaped)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence


class Procs:
    """Starts subprocesses and guarantees none survives the test (kill by pid)."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, argv: Sequence[str], **kw: object) -> subprocess.Popen:
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        p = subprocess.Popen(list(argv), **kw)  # type: ignore[call-overload]
        self.started.append(p)
        return p

    @staticmethod
    def kill(p: subprocess.Popen) -> None:
        if p.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(p.pid, sig)
                except ProcessLookupError:
                    break
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            pass
        for f in (p.stdout, p.stderr, p.stdin):
            if f is not None:
                f.close()

    def kill_all(self) -> None:
        for p in self.started:
            self.kill(p)
