"""llama-server as a supervised engine: its arguments (--port/--host/--metrics/--slots added), launch, metrics.

With the front proxy (the default: core/engines/front_proxy.py, started by the supervisor), the --host/--port the
user gave (or the free port picked) are the PUBLIC address the proxy listens on, and llama-server itself is
started on ENGINE_HOST and a free internal port (`EngineArgs.upstream`)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..host.errors import EngineError
from ..host.sockets import HostError, free_port, port_in_use
from . import command
from .command import HOST_DEFAULT, EngineArgs, resolve_binary
from .declaration import MODEL_FLAGS, PORT_FLAG, engine_port, flag_value

__all__ = ["HOST_DEFAULT", "EngineArgs", "resolve_binary"]

ENGINE_HOST = "127.0.0.1"  # where a proxied llama-server listens: reachable only through the proxy (and by us)


def prepare_args(argv: list[str], proxy: bool = True) -> EngineArgs:
    """Add --metrics/--slots when absent, and --host/--port (a free port when absent). A --port
    given is checked first (core/engines/declaration.py): a DeclarationError (a UsageError) if not 1..65535.
    With `proxy`, that host and port are the public address (the front proxy's) and the engine is
    started on ENGINE_HOST and a free port instead (`upstream`: the user's --host/--port are replaced).
    Any address family (`--host ::1`, `::`, a name); llama-server's other host forms (several
    addresses, `NAME.sock`) need `--no-proxy` (the proxy listens on one address): an EngineError."""
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
    elif proxy and ("," in host or host.endswith(".sock")):
        raise EngineError(f"--host {host}: the front proxy listens on one address; use --no-proxy to serve it directly")
    port = engine_port(out)
    chosen = port is None
    if port is None:
        port = _free(host)
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


def public_address(argv: Sequence[str]) -> tuple[str, int] | None:
    """Where a proxied llama-server's command line is served: (its --host, its --port or 0: any), or None when
    the front proxy cannot serve it (several addresses, a UNIX socket: prepare_args says why)."""
    host = flag_value(argv, "--host") or HOST_DEFAULT
    if "," in host or host.endswith(".sock"):
        return None
    return host, engine_port(argv) or 0


def _hosts(host: str) -> list[str]:
    """The TCP addresses of a --host value (llama-server takes several, comma-separated; `NAME.sock` is none)."""
    return [h for h in host.split(",") if h and not h.endswith(".sock")]


def _free(host: str) -> int:
    """A port free on every TCP address of `host` (the first's, checked on the others)."""
    hosts = _hosts(host)
    if not hosts:
        raise EngineError(f"--host {host}: no TCP address to pick a port on (give --port)")
    try:
        for _ in range(16):
            port = free_port(hosts[0])
            if not any(port_in_use(h, port) for h in hosts[1:]):
                return port
    except HostError as e:
        raise EngineError(f"--host {host}: {e.strerror}") from None
    raise EngineError(f"--host {host}: no port free on all of its addresses")


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
    """Start llama-server (command.start) once its port is known to be free (proxied: its internal one; the
    public one is the front proxy's, bound before)."""
    resolve_binary(args.argv[0])  # a missing binary is said before a port
    assert args.port is not None  # prepare_args always gives one
    for hosts, port in [args.upstream] if args.upstream else [(args.host, args.port)]:
        for host in _hosts(hosts):
            try:
                if port_in_use(host, port):
                    raise EngineError(f"port {port} on {host} is already in use")
            except HostError as e:
                raise EngineError(f"--host {hosts}: {e.strerror}") from None
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
