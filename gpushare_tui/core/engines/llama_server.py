"""llama-server as a supervised engine: arguments, launch, health, metrics."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from .. import paths
from ..declaration import MODEL_FLAGS, PORT_FLAG, engine_port, flag_value
from ..errors import EngineError
from ..logtail import tail_text
from ..spawn import Progress, die_with_parent

HOST_DEFAULT = "127.0.0.1"


@dataclass(frozen=True)
class EngineArgs:
    argv: tuple[str, ...]
    host: str
    port: int
    model: str | None
    port_chosen: bool  # we picked the port


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
    """Add --metrics/--slots when absent, and --host/--port (a free port when absent). A --port
    given is checked first (core/declaration.py): a DeclarationError (a UsageError) if not 1..65535."""
    if not argv:
        raise EngineError("no engine command given (use: -- llama-server ARGS...)")
    out = list(argv)
    for flag in ("--metrics", "--slots"):
        if flag not in out:
            out.append(flag)
    host = flag_value(out, "--host")
    if host is None:
        host = HOST_DEFAULT
        out += ["--host", host]
    port = engine_port(out)
    chosen = port is None
    if port is None:
        port = free_port(host)
        out += [PORT_FLAG, str(port)]
    return EngineArgs(tuple(out), host, port, flag_value(out, *MODEL_FLAGS), chosen)


def model_stem(args: EngineArgs) -> str:
    return Path(args.model).stem if args.model else Path(args.argv[0]).name


def resolve_binary(argv0: str) -> str:
    path = shutil.which(argv0)
    if path is None:
        raise EngineError(f"engine binary not found: {argv0}")
    return path


def start(args: EngineArgs, log_path: str) -> subprocess.Popen:
    """Start the engine in its own process group, output to `log_path`."""
    binary = resolve_binary(args.argv[0])
    if port_in_use(args.host, args.port):
        raise EngineError(f"port {args.port} on {args.host} is already in use")
    log = paths.open_log(log_path)  # in the state directory, never through a link
    try:
        return subprocess.Popen(
            [binary, *args.argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0,
            # continued by the kernel when the supervisor dies, even by SIGKILL: a
            # stopped engine whose supervisor vanished must not stay stopped
            preexec_fn=die_with_parent(signal.SIGCONT),
            close_fds=True,
        )
    except OSError as e:
        raise EngineError(f"cannot start {binary}: {e.strerror}") from None
    finally:
        os.close(log)


def wait_healthy(
    proc: subprocess.Popen,
    base_url: str,
    log_path: str,
    timeout_s: float,
    quit_event: threading.Event | None = None,
    progress: Progress | None = None,
) -> None:
    """Poll /health until 200 (503 = still loading); EngineError if it exits or times out. `progress`
    is called before every poll with what is waited for and for how long, and once healthy (spawn.Progress)."""
    started = time.monotonic()
    deadline = started + timeout_s
    engine = Path(str(proc.args[0])).name if isinstance(proc.args, list | tuple) else "the engine"
    what = f"{engine} /health on {base_url.split('://', 1)[-1]}"
    with httpx.Client(timeout=1.0) as client:
        while True:
            if progress is not None:
                progress(what, time.monotonic() - started, timeout_s, False)
            code = proc.poll()
            if code is not None:
                raise EngineError(f"engine exited with code {code} while loading", tail_text(log_path))
            try:
                if client.get(base_url + "/health").status_code == 200:
                    if progress is not None:
                        progress(what, time.monotonic() - started, timeout_s, True)
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise EngineError(f"engine not healthy after {timeout_s:.0f} s", tail_text(log_path))
            if quit_event is not None and quit_event.wait(0.1):
                raise EngineError("interrupted while the engine was loading", tail_text(log_path))
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
