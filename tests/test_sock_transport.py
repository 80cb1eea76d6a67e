"""The front proxy's transport (core/engines/sock_transport.py) on real sockets and uvloop: what it promises its
protocol as asyncio's transports do (flow control, a close that flushes, a half-close, one connection_lost)."""

from __future__ import annotations

import asyncio
import socket

import uvloop

from gpushare_tui.core.engines.sock_transport import WRITE_HIGH_BYTES, SocketTransport, connect


class Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.eof = 0
        self.lost: list[Exception | None] = []
        self.paused = 0
        self.resumed = 0
        self.keep_open = True

    def data_received(self, data: bytes) -> None:
        self.data += data

    def eof_received(self) -> bool:
        self.eof += 1
        return self.keep_open

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)

    def pause_writing(self) -> None:
        self.paused += 1

    def resume_writing(self) -> None:
        self.resumed += 1


def run(coro):  # type: ignore[no-untyped-def]
    return uvloop.run(asyncio.wait_for(coro, 20))


def read_all(sock: socket.socket) -> bytes:
    sock.setblocking(True)
    out = bytearray()
    while chunk := sock.recv(1 << 16):
        out += chunk
    return bytes(out)


def test_reads_writes_and_the_peers_eof_keeps_it_open_for_writing() -> None:
    async def main() -> None:
        ours, theirs = socket.socketpair()
        live: set = set()
        p = Recorder()
        t = SocketTransport(asyncio.get_running_loop(), ours, p, live)
        theirs.sendall(b"hello")
        theirs.shutdown(socket.SHUT_WR)
        while not p.eof:
            await asyncio.sleep(0.01)
        assert bytes(p.data) == b"hello" and p.eof == 1 and not p.lost
        t.write(b"reply")  # a half-closed peer still reads
        t.close()
        await asyncio.sleep(0.05)
        assert p.lost == [None] and not live
        assert read_all(theirs) == b"reply"
        theirs.close()

    run(main())


def test_a_close_flushes_what_a_slow_reader_has_not_taken_and_flow_control_is_said() -> None:
    async def main() -> None:
        ours, theirs = socket.socketpair()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        live: set = set()
        p = Recorder()
        t = SocketTransport(asyncio.get_running_loop(), ours, p, live)
        blob = bytes(range(256)) * (4 * WRITE_HIGH_BYTES // 256)
        t.write(blob)
        assert p.paused == 1 and t.get_write_buffer_size() > WRITE_HIGH_BYTES
        t.write_eof()
        t.close()  # nothing is lost: the socket closes once all is sent
        loop = asyncio.get_running_loop()
        got = await loop.run_in_executor(None, read_all, theirs)
        assert got == blob
        await asyncio.sleep(0.05)
        assert p.resumed == 1 and p.lost == [None] and not live
        theirs.close()

    run(main())


def test_a_reset_peer_ends_it_once_with_the_error_and_later_writes_are_dropped() -> None:
    async def main() -> None:
        srv = socket.create_server(("127.0.0.1", 0))
        loop = asyncio.get_running_loop()
        sock = await connect(loop, "127.0.0.1", srv.getsockname()[1])
        peer, _ = srv.accept()
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        live: set = set()
        p = Recorder()
        t = SocketTransport(loop, sock, p, live)
        peer.close()  # RST
        for _ in range(100):
            if p.lost:
                break
            t.write(b"x" * 1000)
            await asyncio.sleep(0.01)
        assert len(p.lost) == 1 and isinstance(p.lost[0], OSError)
        assert t.is_closing() and not live
        t.write(b"more")  # dropped, no error
        t.close()
        t.abort()
        await asyncio.sleep(0.02)
        assert len(p.lost) == 1
        srv.close()

    run(main())


def test_connect_fails_with_oserror_when_nobody_listens() -> None:
    async def main() -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        try:
            await connect(asyncio.get_running_loop(), "127.0.0.1", port)
        except OSError:
            return
        raise AssertionError("connected to a closed port")

    run(main())


def test_paused_reading_reads_nothing_until_resumed() -> None:
    async def main() -> None:
        ours, theirs = socket.socketpair()
        p = Recorder()
        t = SocketTransport(asyncio.get_running_loop(), ours, p, set())
        t.pause_reading()
        theirs.sendall(b"wait")
        await asyncio.sleep(0.05)
        assert not p.data and not t.is_reading()
        t.resume_reading()
        await asyncio.sleep(0.05)
        assert bytes(p.data) == b"wait"
        t.abort()
        await asyncio.sleep(0.01)
        assert p.lost == [None]
        theirs.close()

    run(main())
