"""llama-server as a supervised engine: its arguments (--port/--host/--metrics/--slots added), launch, metrics."""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..declaration import MODEL_FLAGS, PORT_FLAG, engine_port, flag_value
from ..errors import EngineError
from . import command
from .command import HOST_DEFAULT, EngineArgs, resolve_binary

__all__ = ["HOST_DEFAULT", "EngineArgs", "resolve_binary"]


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


def start(args: EngineArgs, log_path: str) -> subprocess.Popen:
    """Start llama-server (command.start) once its port is known to be free."""
    resolve_binary(args.argv[0])  # a missing binary is said before a port
    assert args.port is not None  # prepare_args always gives one
    if port_in_use(args.host, args.port):
        raise EngineError(f"port {args.port} on {args.host} is already in use")
    return command.start(args.argv, log_path)


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
