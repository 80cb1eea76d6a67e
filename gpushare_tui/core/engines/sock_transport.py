"""A TCP connection for the front proxy's loop: a non-blocking socket read and written by the loop's
`add_reader`/`add_writer` callbacks, driving an asyncio.Protocol as the loop's own transport would.

    transport = SocketTransport(loop, sock, protocol, live)   # protocol.connection_made(transport), reading

Why not the loop's transport (uvloop's TCPTransport): a streamed token is one read of the engine and one write
to the client, and the proxy is woken once per token; uvloop's transport machinery around each read and write
cost more per wake than the relay's own work (measured in bench/proxy.py: this one's ~2× cheaper a token at
1 stream on a shared 2-core machine, where each wake runs cache-cold). Here a read is one `recv` and a call of
`data_received`; a write is one `send`, buffered (and `add_writer`) only when the socket would block.

What it does as asyncio's transports do: reads of up to READ_BYTES; `eof_received` at the peer's EOF (a true
return keeps the socket open for writing); `connection_lost` once, soon after `close` (when what was written is
sent), `abort`, or an error on the socket; `pause_writing` above WRITE_HIGH_BYTES unsent, `resume_writing`
below WRITE_LOW_BYTES; `write_eof` half-closes once what was written is sent. A write after `close` or once
the connection is lost is dropped (the protocol checks `is_closing` first). `live`: a set it is in until it
is torn down, so its owner can abort what remains when the loop ends (no fd outlives it)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

READ_BYTES = 256 * 1024  # as uvloop reads
WRITE_HIGH_BYTES = 64 * 1024  # asyncio's default write buffer limits
WRITE_LOW_BYTES = 16 * 1024
_WOULD_BLOCK = (BlockingIOError, InterruptedError)


class SocketTransport(asyncio.Transport):
    """`sock` (connected, any blocking mode) on `loop`, driving `protocol`; see the module's docstring."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: asyncio.Protocol, live: set[Any]
    ) -> None:
        super().__init__()
        sock.setblocking(False)
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._live = live
        self._recv = sock.recv
        self._send = sock.send
        self._buf = bytearray()  # written, not yet sent
        self._reading = False
        self._read_eof = False
        self._closing = False
        self._eof_asked = False
        self._torn = False
        self._protocol_paused = False
        live.add(self)
        protocol.connection_made(self)
        self.resume_reading()

    # -- reading --------------------------------------------------------------------------------------------

    def _read_ready(self) -> None:
        try:
            data = self._recv(READ_BYTES)
        except _WOULD_BLOCK:
            return
        except OSError as e:
            self._fatal(e)
            return
        try:
            if data:
                self._protocol.data_received(data)
                return
            self._read_eof = True
            self.pause_reading()
            if not self._protocol.eof_received():
                self.close()
        except Exception as e:  # a protocol's bug: the connection ends with it, as the loop's transport does
            self._fatal(e)

    def pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if not self._reading and not self._read_eof and not self._closing:
            self._reading = True
            self._loop.add_reader(self._fd, self._read_ready)

    def is_reading(self) -> bool:
        return self._reading

    # -- writing --------------------------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self._eof_asked or not data:
            return
        if not self._buf:
            try:
                n = self._send(data)
            except _WOULD_BLOCK:
                n = 0
            except OSError as e:
                self._fatal(e)
                return
            if n == len(data):
                return
            data = memoryview(data)[n:]
            self._loop.add_writer(self._fd, self._write_ready)
        self._buf += data
        if not self._protocol_paused and len(self._buf) > WRITE_HIGH_BYTES:
            self._protocol_paused = True
            self._protocol.pause_writing()

    def _write_ready(self) -> None:
        try:
            n = self._send(self._buf)
        except _WOULD_BLOCK:
            return
        except OSError as e:
            self._fatal(e)
            return
        del self._buf[:n]
        if self._protocol_paused and len(self._buf) <= WRITE_LOW_BYTES:
            self._protocol_paused = False
            self._protocol.resume_writing()
        if self._buf:
            return
        self._loop.remove_writer(self._fd)
        if self._closing:
            self._teardown(None)
        elif self._eof_asked:
            self._shutdown_write()

    def write_eof(self) -> None:
        if self._closing or self._eof_asked:
            return
        self._eof_asked = True
        if not self._buf:
            self._shutdown_write()

    def _shutdown_write(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return len(self._buf)

    # -- ending ---------------------------------------------------------------------------------------------

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Stop reading; once what was written is sent, close the socket and tell the protocol."""
        if self._closing:
            return
        self._closing = True
        self.pause_reading()
        if not self._buf:
            self._teardown(None)

    def abort(self) -> None:
        self._fatal(None)

    def _fatal(self, exc: Exception | None) -> None:
        self._closing = True
        self._buf.clear()
        self._teardown(exc)

    def _teardown(self, exc: Exception | None) -> None:
        """The socket closed now; the protocol told on the loop's next turn (as asyncio's transports do)."""
        if self._torn:
            return
        self._torn = True
        self._closing = True
        self._reading = False
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        self._live.discard(self)
        self._sock.close()
        self._loop.call_soon(self._protocol.connection_lost, exc)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "socket":
            return self._sock
        if name == "peername":
            try:
                return self._sock.getpeername()
            except OSError:
                return default
        return default


async def connect(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket connected to `host`:`port` (each address it resolves to, in turn), TCP_NODELAY
    set; OSError for the last address's failure."""
    try:  # an address literal (the engine's usual upstream) needs no resolver
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    last: OSError = OSError(f"{host}: no address")
    for family, type_, proto, _name, addr in infos:
        sock = socket.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            nodelay(sock)
            await loop.sock_connect(sock, addr)
            return sock
        except OSError as e:
            sock.close()
            last = e
        except BaseException:
            sock.close()
            raise
    raise last


def nodelay(sock: socket.socket) -> None:
    """Each write sent at once (a stream's token is one small write: Nagle would hold it)."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass
