"""core/host/sockets.py: listening sockets from the kernel's tables, and the inodes a process holds."""

from __future__ import annotations

import ipaddress
import os
import socket

import pytest

from gpushare_tui.core.host import sockets

ADDRESSES = [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"), (socket.AF_INET6, "::")]


@pytest.mark.parametrize("family,host", ADDRESSES)
def test_a_listener_is_found_with_its_address_uid_and_inode(family, host) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        s.listen()
        port = s.getsockname()[1]
        found = sockets.listeners(port)
        assert [(ln.family, ln.address, ln.uid) for ln in found] == [(family, ipaddress.ip_address(host), os.geteuid())]
        assert found[0].inode == os.fstat(s.fileno()).st_ino
        assert found[0].inode in sockets.socket_inodes([os.getpid()])
        assert os.getpid() in sockets.holders(found[0].inode)
        assert found[0].accepts(ipaddress.ip_address(host))
    assert sockets.listeners(port) == []


def test_a_connected_socket_is_no_listener() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            assert len(sockets.listeners(port)) == 1


def test_which_addresses_are_looked_at() -> None:
    assert sockets.resolve_local("localhost") == [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    assert sockets.resolve_local("[::1]") == [ipaddress.ip_address("::1")]
    assert sockets.resolve_local("0.0.0.0") == [ipaddress.ip_address("0.0.0.0")]
    assert sockets.resolve_local("10.1.2.3") is None and sockets.resolve_local("example.com") is None


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "::", "localhost"])
def test_port_helpers_follow_the_address_family(host) -> None:
    port = sockets.free_port(host)
    assert not sockets.port_in_use(host, port)
    family, addr = sockets.addresses(host, port)[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(addr)
        s.listen()
        assert sockets.port_in_use(host, port)


def test_a_host_that_names_no_address_is_one_error() -> None:
    with pytest.raises(sockets.HostError, match="host 'no-such-host.invalid'"):
        sockets.port_in_use("no-such-host.invalid", 80)
    assert (
        sockets.host_port("::1", 80) == "[::1]:80" and sockets.http_url("127.0.0.1", 8, "/x") == "http://127.0.0.1:8/x"
    )


def test_an_answer_from_a_port_no_engine_socket_holds_is_said_at_the_timeout(tmp_path) -> None:
    """A port that answers while nothing of the engine's tree listens there (forwarded from elsewhere) is
    never ready, and the timeout says why."""
    import subprocess
    import sys

    from gpushare_tui.core.engines import health
    from gpushare_tui.core.host.errors import EngineError

    log = tmp_path / "e.log"
    log.write_text("")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(EngineError, match="no socket of the engine's process tree listens there"):
            health.wait_ready(proc, lambda: True, str(log), 0.3, owned=lambda: False)
    finally:
        proc.kill()
        proc.wait()
