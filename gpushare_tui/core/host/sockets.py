"""Which process listens on a TCP port, from the kernel (Linux): its sock_diag netlink dump (or, where
that is refused, /proc/net/tcp and tcp6) gives each listening socket's address, owner uid and inode;
/proc/PID/fd links name the inodes a process holds (`socket:[INODE]`). An engine's port is the
engine's only when its listening socket is held by the engine's process tree (design.md, "Trust of
what an engine exposes"): anything else listening there, another user's squatter above all, must not
make us declare it ready or pace by its numbers. Also: ports of any address family (`--host ::1`).

Budgets (core/host/budgets.py): at most LISTEN_TABLE_MAX_BYTES of a dump or table is read (a table
only while its lines are listening sockets: the kernel lists those first); at most TREE_FDS_MAX fd
links are read for one tree."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

from .budgets import LISTEN_TABLE_MAX_BYTES, LISTEN_TABLE_READ_BYTES, TREE_FDS_MAX

TCP_LISTEN = b"0A"
TABLES = ((socket.AF_INET, "/proc/net/tcp"), (socket.AF_INET6, "/proc/net/tcp6"))

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Listener:
    family: int
    address: Address
    port: int
    uid: int
    inode: int

    def accepts(self, host: Address) -> bool:
        """Whether a connection to `host` on this port may reach this socket: its own address, or a
        wildcard of its family (an IPv6 wildcard may take IPv4 too: dual stack)."""
        if self.address.is_unspecified:
            return self.family == socket.AF_INET6 or host.version == 4
        mapped = getattr(self.address, "ipv4_mapped", None)
        return self.address == host or (mapped is not None and mapped == host)

    def __str__(self) -> str:
        return f"[{self.address}]:{self.port}" if self.family == socket.AF_INET6 else f"{self.address}:{self.port}"


def _address(hex_addr: str) -> Address:
    raw = bytes.fromhex(hex_addr)
    # the kernel prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def _listening_lines(path: str) -> list[bytes]:
    """The lines of a /proc/net/tcp{,6} table that are listening sockets, read in small pieces: the
    kernel makes the table as it is read (walking every bucket of its connection hash: ~5 ms a
    table read whole here), and lists listening sockets first, so reading stops at the first line
    that is not one (~0.05 ms). [] when there is no such table (no IPv6)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return []
    lines: list[bytes] = []
    try:
        data, read, header = b"", 0, True
        while read < LISTEN_TABLE_MAX_BYTES:
            chunk = os.read(fd, LISTEN_TABLE_READ_BYTES)
            if not chunk:
                break
            read += len(chunk)
            *complete, data = (data + chunk).split(b"\n")
            for raw in complete:
                if header:
                    header = False
                    continue
                fields = raw.split()
                if len(fields) < 10 or fields[3] != TCP_LISTEN:
                    return lines  # the rest are connections
                lines.append(raw)
    finally:
        os.close(fd)
    return lines


NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST_DUMP = 0x301
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCPF_LISTEN = 1 << 10
NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
DIAG_REQUEST = struct.Struct("=BBBBI48x")  # family, protocol, ext, pad, states; the socket id left zero
DIAG_REPLY_BYTES = (
    72  # inet_diag_msg: family, state, timer, retrans, id (48 bytes), expires, rqueue, wqueue, uid, inode
)


def _diag_listeners(family: int) -> list[tuple[Address, int, int, int]]:
    """(address, port, uid, inode) of every TCP socket of `family` listening, from the kernel's sock_diag
    netlink dump (the kernel walks only its listening hash: ~0.07 ms); OSError where it is refused."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as s:
        request = DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, TCPF_LISTEN)
        s.sendto(
            NLMSG_HEADER.pack(NLMSG_HEADER.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST_DUMP, 1, 0)
            + request,
            (0, 0),
        )
        s.settimeout(1.0)
        found: list[tuple[Address, int, int, int]] = []
        read = 0
        while read < LISTEN_TABLE_MAX_BYTES:
            data = s.recv(65536)
            read += len(data)
            off = 0
            while off + NLMSG_HEADER.size <= len(data):
                length, kind = NLMSG_HEADER.unpack_from(data, off)[:2]
                if kind == NLMSG_DONE:
                    return found
                if kind == NLMSG_ERROR:
                    raise OSError(-struct.unpack_from("=i", data, off + NLMSG_HEADER.size)[0], "sock_diag refused")
                msg = data[off + NLMSG_HEADER.size : off + length]
                if length < NLMSG_HEADER.size or len(msg) < DIAG_REPLY_BYTES:
                    raise OSError(0, "sock_diag: a short reply")
                port = struct.unpack_from(">H", msg, 4)[0]
                raw = msg[8 : 8 + (4 if family == socket.AF_INET else 16)]
                uid, inode = struct.unpack_from("=II", msg, 64)
                found.append((ipaddress.ip_address(raw), port, uid, inode))
                off += (length + 3) & ~3
        raise OSError(0, "sock_diag: a dump past its budget")


def listeners(port: int) -> list[Listener]:
    """Every TCP socket listening on `port` (IPv4 and IPv6), as the kernel lists them: by sock_diag,
    else (refused) from /proc/net/tcp{,6}."""
    try:
        return [
            Listener(family, addr, port, uid, inode)
            for family, _ in TABLES
            for addr, p, uid, inode in _diag_listeners(family)
            if p == port
        ]
    except OSError:
        pass
    found: list[Listener] = []
    for family, path in TABLES:
        for raw in _listening_lines(path):
            fields = raw.split()
            local, _, hex_port = fields[1].decode().partition(":")
            if int(hex_port, 16) == port:
                found.append(Listener(family, _address(local), port, int(fields[7]), int(fields[9])))
    return found


def _socket_links(pid: int, limit: int) -> tuple[list[str], int]:
    """The `socket:[INODE]` links among `pid`'s first `limit` fds ([] when gone or not ours to read),
    and how many fd links were read."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")[:limit]
    except OSError:
        return [], 0
    links = []
    for name in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            links.append(link)
    return links, len(names)


def socket_inodes(pids: list[int]) -> set[int]:
    """The inodes of the sockets `pids` hold (at most TREE_FDS_MAX fd links read in all)."""
    inodes: set[int] = set()
    budget = TREE_FDS_MAX
    for pid in pids:
        if budget <= 0:
            break
        links, read = _socket_links(pid, budget)
        budget -= max(1, read)
        inodes.update(int(link[8:-1]) for link in links)
    return inodes


def holders(inode: int, limit: int = 4) -> list[int]:
    """Up to `limit` pids holding socket `inode` (only processes we may read: all of them as root)."""
    target = f"socket:[{inode}]"
    found = [int(n) for n in os.listdir("/proc") if n.isdigit() and target in _socket_links(int(n), TREE_FDS_MAX)[0]]
    return found[:limit]


def resolve_local(host: str) -> list[Address] | None:
    """The addresses `host` names when all are this host's loopback or wildcard (`localhost`,
    `127.0.0.1`, `::1`, `0.0.0.0`, `::`): those are checked; None for any other host (another
    machine's port is not ours to check)."""
    try:
        addrs = [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        if host != "localhost":
            return None
        addrs = [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    if all(a.is_loopback or a.is_unspecified for a in addrs):
        return addrs
    return None


# -- ports of any address family (issue 26 item 8: `--host ::1`) ------------------------------------------


def host_port(host: str, port: int) -> str:
    """`HOST:PORT` as a person and a URL write it: `127.0.0.1:8080`, `[::1]:8080`."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def http_url(host: str, port: int, path: str = "") -> str:
    return f"http://{host_port(host, port)}{path}"


class HostError(OSError):
    """A host that names no address here (its `strerror` says why)."""


def addresses(host: str, port: int = 0) -> list[tuple[int, tuple]]:
    """(family, socket address) of each address `host` names (`127.0.0.1`, `::1`, `::`, `[::1]`, a
    name such as `localhost`: each of its addresses); HostError when it names none."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise HostError(0, f"host {host!r}: {getattr(e, 'strerror', None) or e}") from None
    seen: list[tuple[int, tuple]] = []
    for family, _, _, _, addr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and (family, addr) not in seen:
            seen.append((family, addr))
    if not seen:
        raise HostError(0, f"host {host!r}: no IPv4 or IPv6 address")
    return seen


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now on `host`'s (first) address, of its family; HostError for a host that names none."""
    family, addr = addresses(host)[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(addr[:2] if family == socket.AF_INET else addr)
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """Whether `port` cannot be bound on one of the addresses `host` names (as a listener with
    SO_REUSEADDR would: a port in TIME_WAIT is free); HostError for a host that names none."""
    for family, addr in addresses(host, port):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # [::]:P and 0.0.0.0:P are two ports
            try:
                s.bind(addr)
            except OSError:
                return True
    return False
