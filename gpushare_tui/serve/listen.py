"""`--listen HOST:PORT`: parsing, and binding errors as one line."""

from __future__ import annotations

import errno
import ipaddress

from ..core.engines.declaration import DeclarationError, check_port
from ..core.host.errors import GpushareError, UsageError
from ..core.host.sockets import host_port

DEFAULT_LISTEN = "127.0.0.1:9464"


def parse_listen(text: str, *, label: str = "--listen") -> tuple[str, int]:
    """(IP literal, port) from `HOST:PORT` or `[IPv6]:PORT`; `localhost` is 127.0.0.1; port 0 picks a free one.
    A DeclarationError (a UsageError: one line, `label` naming the value) for anything else: names are not
    resolved (a listener is configured by address). `serve --listen` and `up`'s `[serve] listen` both parse here."""

    def bad(problem: str) -> DeclarationError:
        return DeclarationError("listen", text, problem, label=label)

    if text.startswith("["):
        host, close, rest = text[1:].partition("]")
        if not close or not rest.startswith(":"):
            raise bad("use HOST:PORT or [IPv6]:PORT")
        port_text = rest[1:]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon or not host:
            raise bad(f"use HOST:PORT, e.g. {DEFAULT_LISTEN}")
    try:
        port = check_port(port_text, any_port=True)
    except DeclarationError as e:
        raise bad(f"the port {e.problem}") from None
    if host == "localhost":
        host = "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise bad(f"{host!r} is not an IP address") from None
    return str(addr), port


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


def bind_error(host: str, port: int, e: OSError) -> GpushareError:
    """The one-line error for a listener that could not bind: usage (2) for an address this host does
    not have, runtime (1) otherwise (port in use, no permission)."""
    where = host_port(host, port)
    if e.errno == errno.EADDRINUSE:
        return GpushareError(f"cannot listen on {where}: the port is in use")
    if e.errno == errno.EADDRNOTAVAIL:
        return UsageError(f"cannot listen on {where}: no such address on this host")
    if e.errno == errno.EACCES:
        return GpushareError(f"cannot listen on {where}: permission denied (ports below 1024 need privileges)")
    return GpushareError(f"cannot listen on {where}: {e.strerror or e}")
