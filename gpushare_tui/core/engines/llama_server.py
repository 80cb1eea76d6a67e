"""llama-server as a supervised engine: its arguments (--port/--host/--metrics/--slots added), launch, metrics.

With the front proxy (the default: core/engines/front_proxy.py, started by the supervisor), the --host/--port the
user gave (or the free port picked) are the PUBLIC address the proxy listens on, and llama-server itself is
started on ENGINE_HOST and a free internal port (`EngineArgs.upstream`)."""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..host.errors import EngineError
from . import command
from .command import HOST_DEFAULT, EngineArgs, resolve_binary
from .declaration import MODEL_FLAGS, PORT_FLAG, engine_port, flag_value

__all__ = ["HOST_DEFAULT", "EngineArgs", "resolve_binary"]

ENGINE_HOST = "127.0.0.1"  # where a proxied llama-server listens: reachable only through the proxy (and by us)


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


def prepare_args(argv: list[str], proxy: bool = True) -> EngineArgs:
    """Add --metrics/--slots when absent, and --host/--port (a free port when absent). A --port
    given is checked first (core/engines/declaration.py): a DeclarationError (a UsageError) if not 1..65535.
    With `proxy`, that host and port are the public address (the front proxy's) and the engine is
    started on ENGINE_HOST and a free port instead (`upstream`: the user's --host/--port are replaced)."""
    if not argv:
        raise EngineError("no engine command given (use: -- llama-server ARGS...)")
    out = list(argv)
    for flag in ("--metrics", "--slots"):
        if flag not in out:
            out.append(flag)
    host = flag_value(out, "--host")
    if host is None:
        host = HOST_DEFAULT
        if not proxy:
            out += ["--host", host]
    port = engine_port(out)
    chosen = port is None
    if port is None:
        port = free_port(host)
        if not proxy:
            out += [PORT_FLAG, str(port)]
    upstream = None
    if proxy:
        inner = free_port(ENGINE_HOST)
        while inner == port:  # a port just closed may be handed out again
            inner = free_port(ENGINE_HOST)
        upstream = (ENGINE_HOST, inner)
        out = [*_without(out, ("--host", PORT_FLAG)), "--host", upstream[0], PORT_FLAG, str(upstream[1])]
    return EngineArgs(tuple(out), host, port, flag_value(out, *MODEL_FLAGS), chosen, upstream)


def _without(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """`argv` less every `FLAG VALUE` / `FLAG=VALUE` of `flags` (the program, argv[0], is kept)."""
    out, i = argv[:1], 1
    while i < len(argv):
        a = argv[i]
        if a in flags:
            i += 2
            continue
        if not any(a.startswith(f + "=") for f in flags):
            out.append(a)
        i += 1
    return out


def model_stem(args: EngineArgs) -> str:
    return Path(args.model).stem if args.model else Path(args.argv[0]).name


def start(args: EngineArgs, log_path: str) -> subprocess.Popen:
    """Start llama-server (command.start) once its port (and, proxied, the public one) is known to be free."""
    resolve_binary(args.argv[0])  # a missing binary is said before a port
    assert args.port is not None  # prepare_args always gives one
    for host, port in ((args.host, args.port), *([args.upstream] if args.upstream else [])):
        if port_in_use(host, port):
            raise EngineError(f"port {port} on {host} is already in use")
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
