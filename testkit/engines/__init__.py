"""Stand-in engines of issue 19 (real processes, stdlib + prometheus_client only), run as modules:

    python -m testkit.engines.http_engine --port N [--load-s S] [--work-units U] [--workers K]
        [--gauge NAME] [--exit-during-load CODE]
    python -m testkit.engines.multiproc_engine [--workers 2] [--work-cpu-s S]

Tests, benchmarks and `up` files start them with `engine_command(MODULE, *ARGS)`: it runs from any cwd.

http_engine: an HTTP server whose /health is 503 while "loading" and 200 after; each POST /work does
real CPU work in a worker process; /metrics exposes an in-flight gauge. multiproc_engine: a parent
that starts CPU-bound worker processes (the tree a CUDA engine's workers make)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler

from testkit.paths import REPO

PR_SET_PDEATHSIG = 1


def burn_units(units: int) -> int:
    """Deterministic CPU work: `units` rounds of integer arithmetic (about a millisecond each)."""
    x = 0
    for _ in range(units):
        for i in range(5_000):
            x = (x * 31 + i) & 0xFFFFFFFF
    return x


def burn_cpu_s(cpu_s: float) -> None:
    """Spin until this process has used `cpu_s` of CPU time (time stopped by SIGSTOP does not count)."""
    end = time.process_time() + cpu_s
    while time.process_time() < end:
        burn_units(1)


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this worker when its parent exits (even by SIGKILL), so no stand-in engine's worker
    outlives the engine a test killed by pid."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl
        os._exit(1)


def engine_command(module: str, *args: str) -> list[str]:
    """The command that runs stand-in engine `module` ("http_engine", "multiproc_engine") with `args`, from
    any cwd and under any supervisor (which runs a command exactly as given, in its own cwd and environment):
    `env` puts this checkout on PYTHONPATH, then execs `python -m testkit.engines.MODULE ARGS` (same pid)."""
    return ["env", f"PYTHONPATH={REPO}", sys.executable, "-m", f"testkit.engines.{module}", *args]


class JsonHandler(BaseHTTPRequestHandler):
    """The stand-in HTTP engines' request handler base: HTTP/1.1 (kept alive), `_reply` with a Content-Length,
    no access log."""

    protocol_version = "HTTP/1.1"

    def _reply(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass
