"""A listening socket handed down to `gpushare-tui run`: by systemd's socket activation (sd_listen_fds(3):
LISTEN_PID, LISTEN_FDS, fds from 3) or by `up` (`--listen-fd N`). The socket outlives each supervisor, so
connections that come while none runs wait in its backlog instead of being refused.

systemd's rules, as sd_listen_fds(3) applies them: LISTEN_FDS is for us only when LISTEN_PID is our pid
(else it is someone else's, left by a parent, and ignored); the variables (and LISTEN_FDNAMES) are removed
either way, so an engine we start never takes them for its own. What is for us and unusable is invalid input
(ListenFdError, exit 2, one line): LISTEN_FDS not a count, more than one fd (one engine, one port), or an fd
that is not a listening TCP socket (not a socket, a UDP or UNIX one, one not listening)."""

from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import MutableMapping

from .errors import UsageError

SD_LISTEN_FDS_START = 3  # the first fd systemd passes
LISTEN_ENV = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


class ListenFdError(UsageError):
    """A socket handed down that cannot be served; the message says which and why."""


def from_systemd(env: MutableMapping[str, str] | None = None, pid: int | None = None) -> socket.socket | None:
    """The listening socket systemd passed to this process (`pid`, default ours), or None when it passed none;
    ListenFdError when it passed one we cannot serve. The LISTEN_* variables are removed from `env`."""
    env = os.environ if env is None else env
    listen_pid, listen_fds = env.get("LISTEN_PID"), env.get("LISTEN_FDS")
    for name in LISTEN_ENV:
        env.pop(name, None)
    if listen_pid is None or listen_fds is None:
        return None
    if listen_pid.strip() != str(os.getpid() if pid is None else pid):
        return None  # for another process (sd_listen_fds: not ours, ignored)
    try:
        count = int(listen_fds)
    except ValueError:
        raise ListenFdError(f"LISTEN_FDS={listen_fds[:40]!r} is not a count of file descriptors") from None
    if count <= 0:
        return None
    if count > 1:
        raise ListenFdError(
            f"LISTEN_FDS={count}: one listening socket per engine (its .socket unit has one ListenStream=)"
        )
    return listening_socket(SD_LISTEN_FDS_START, "LISTEN_FDS")


def listening_socket(fd: int, what: str) -> socket.socket:
    """`fd` (named by `what`) as a listening TCP socket (IPv4 or IPv6), not inherited by what we start;
    ListenFdError when it is none."""
    where = f"{what}: fd {fd}"
    try:
        mode = os.fstat(fd).st_mode
    except OSError as e:
        raise ListenFdError(f"{where} is not open ({e.strerror})") from None
    if not stat.S_ISSOCK(mode):
        raise ListenFdError(f"{where} is not a socket")
    sock = socket.socket(fileno=os.dup(fd))  # its family and type as the kernel says
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            raise ListenFdError(f"{where} is not a TCP socket ({sock.family.name})")
        if sock.type != socket.SOCK_STREAM:
            raise ListenFdError(f"{where} is not a TCP socket ({sock.type.name}: a datagram socket?)")
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise ListenFdError(f"{where} is a socket that does not listen")
    except BaseException:
        sock.close()
        raise
    os.close(fd)  # our copy is `sock` (close-on-exec: the engine does not get it)
    return sock


def address(sock: socket.socket) -> tuple[str, int]:
    """The (host, port) a listening socket is bound to."""
    host, port = sock.getsockname()[:2]
    return host, port


def bind_listening(listen: tuple[str, int], backlog: int) -> socket.socket:
    """A TCP socket listening on `listen` (host, port; IPv6 when the host has a colon; port 0: any free one);
    ListenFdError when it cannot be bound (the port in use, an address not ours)."""
    host, port = listen
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(listen)
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ListenFdError(f"cannot listen on {host}:{port}: port {port} is already in use") from None
        raise ListenFdError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock
