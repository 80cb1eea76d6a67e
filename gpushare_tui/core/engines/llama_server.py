"""llama-server as a supervised engine: arguments, launch, health, metrics."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..errors import EngineError

HOST_DEFAULT = "127.0.0.1"
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class EngineArgs:
    argv: tuple[str, ...]
    host: str
    port: int
    model: str | None
    port_chosen: bool  # we picked the port


def _flag_value(argv: list[str], *names: str) -> str | None:
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def free_port(host: str = HOST_DEFAULT) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def prepare_args(argv: list[str]) -> EngineArgs:
    """Add --metrics/--slots when absent, and --host/--port (a free port when absent)."""
    if not argv:
        raise EngineError("no engine command given (use: -- llama-server ARGS...)")
    out = list(argv)
    for flag in ("--metrics", "--slots"):
        if flag not in out:
            out.append(flag)
    host = _flag_value(out, "--host")
    if host is None:
        host = HOST_DEFAULT
        out += ["--host", host]
    port_s = _flag_value(out, "--port")
    chosen = port_s is None
    if port_s is None:
        port = free_port(host)
        out += ["--port", str(port)]
    else:
        try:
            port = int(port_s)
        except ValueError:
            raise EngineError(f"invalid --port {port_s!r}") from None
    return EngineArgs(tuple(out), host, port, _flag_value(out, "-m", "--model"), chosen)


def model_stem(args: EngineArgs) -> str:
    return Path(args.model).stem if args.model else Path(args.argv[0]).name


def resolve_binary(argv0: str) -> str:
    path = shutil.which(argv0)
    if path is None:
        raise EngineError(f"engine binary not found: {argv0}")
    return path


def _child_setup() -> None:
    # Continued by the kernel when the supervisor dies, even by SIGKILL: a
    # stopped engine whose supervisor vanished must not stay stopped.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGCONT, 0, 0, 0)


def start(args: EngineArgs, log_path: str) -> subprocess.Popen:
    """Start the engine in its own process group, output to `log_path`."""
    binary = resolve_binary(args.argv[0])
    if port_in_use(args.host, args.port):
        raise EngineError(f"port {args.port} on {args.host} is already in use")
    log = open(log_path, "ab", buffering=0)
    try:
        return subprocess.Popen(
            [binary, *args.argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0,
            preexec_fn=_child_setup,
            close_fds=True,
        )
    except OSError as e:
        raise EngineError(f"cannot start {binary}: {e.strerror}") from None
    finally:
        log.close()


def log_tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            return "\n".join(x.decode("utf-8", "replace") for x in deque(f.read().splitlines(), lines))
    except OSError:
        return ""


def wait_healthy(
    proc: subprocess.Popen, base_url: str, log_path: str, timeout_s: float, quit_event: threading.Event | None = None
) -> None:
    """Poll /health until 200 (503 = still loading); EngineError if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1.0) as client:
        while True:
            code = proc.poll()
            if code is not None:
                raise EngineError(f"engine exited with code {code} while loading", log_tail(log_path))
            try:
                if client.get(base_url + "/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise EngineError(f"engine not healthy after {timeout_s:.0f} s", log_tail(log_path))
            if quit_event is not None and quit_event.wait(0.1):
                raise EngineError("interrupted while the engine was loading", log_tail(log_path))
            time.sleep(0 if quit_event else 0.1)


@dataclass(frozen=True)
class Metrics:
    n_decode_total: float
    requests_processing: float


def parse_metrics(text: str) -> Metrics:
    """The counters we use from llama-server's Prometheus text."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:"):
            name, _, value = line.partition(" ")
            try:
                values[name[len("llamacpp:") :]] = float(value)
            except ValueError:
                pass
    return Metrics(
        values.get("n_decode_total", 0.0),
        values.get("requests_processing", 0.0),
    )
