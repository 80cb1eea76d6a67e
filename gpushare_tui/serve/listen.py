"""`--listen HOST:PORT`: parsing, and binding errors as one line."""

from __future__ import annotations

import errno
import ipaddress

from ..core.errors import GpushareError, UsageError

DEFAULT_LISTEN = "127.0.0.1:9464"


def parse_listen(text: str) -> tuple[str, int]:
    """(IP literal, port) from `HOST:PORT` or `[IPv6]:PORT`; `localhost` is 127.0.0.1; port 0 picks a free one.
    UsageError (one line) for anything else: names are not resolved (a listener is configured by address)."""
    bad = f"invalid --listen {text!r}: "
    if text.startswith("["):
        host, close, rest = text[1:].partition("]")
        if not close or not rest.startswith(":"):
            raise UsageError(bad + "use HOST:PORT or [IPv6]:PORT")
        port_text = rest[1:]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon or not host:
            raise UsageError(bad + "use HOST:PORT, e.g. 127.0.0.1:9464")
    if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > 65535:
        raise UsageError(bad + "the port is a number 0..65535")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(bad + f"{host!r} is not an IP address") from None
    return str(addr), int(port_text)


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


def bind_error(host: str, port: int, e: OSError) -> GpushareError:
    """The one-line error for a listener that could not bind: usage (2) for an address this host does
    not have, runtime (1) otherwise (port in use, no permission)."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if e.errno == errno.EADDRINUSE:
        return GpushareError(f"cannot listen on {where}: the port is in use")
    if e.errno == errno.EADDRNOTAVAIL:
        return UsageError(f"cannot listen on {where}: no such address on this host")
    if e.errno == errno.EACCES:
        return GpushareError(f"cannot listen on {where}: permission denied (ports below 1024 need privileges)")
    return GpushareError(f"cannot listen on {where}: {e.strerror or e}")
