"""Which process listens on a TCP port, from the kernel's tables (Linux): /proc/net/tcp and tcp6 give
each listening socket's address, owner uid and inode; /proc/PID/fd links name the inodes a process
holds (`socket:[INODE]`). An engine's port is the engine's only when its listening socket is held by
the engine's process tree (design.md, "Trust of what an engine exposes"): anything else listening
there, another user's squatter above all, must not make us declare it ready or pace by its numbers.

Budgets (core/host/budgets.py): a table is read only while its lines are listening sockets (the
kernel lists those first) and at most LISTEN_TABLE_MAX_BYTES of it; at most TREE_FDS_MAX fd links
are read for one tree."""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass

from .budgets import LISTEN_TABLE_MAX_BYTES, TREE_FDS_MAX

TCP_LISTEN = "0A"
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


def listeners(port: int) -> list[Listener]:
    """Every TCP socket listening on `port` (IPv4 and IPv6), as the kernel lists them."""
    found: list[Listener] = []
    for family, path in TABLES:
        try:
            f = open(path, "rb")
        except OSError:
            continue  # no IPv6 in this kernel
        with f:
            f.readline()  # the header
            read = 0
            for raw in f:
                read += len(raw)
                fields = raw.split()
                if read > LISTEN_TABLE_MAX_BYTES or len(fields) < 10 or fields[3].decode() != TCP_LISTEN:
                    break  # listening sockets come first: the rest are connections
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
