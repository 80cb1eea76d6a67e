"""The HTTP server of `serve`: GET /metrics, /gpu/peers[?gpu_key=K], /healthz. Read-only.

An asyncio server (h11 parses HTTP): each connection is a coroutine, a few KiB, not a thread, so a
slowloris that holds sockets open holds no worker. Bounded against hostile clients (core/host/budgets.py):
the request line and headers must arrive within SERVE_HEADER_DEADLINE_S (at most SERVE_MAX_HEADER_BYTES),
the whole request and its reply within SERVE_REQUEST_DEADLINE_S; at most SERVE_MAX_CONNECTIONS are open,
and when full the oldest one still sending its headers makes room (only when none is, a newcomer gets
503). One request per connection. `/healthz` is answered on the event loop, never behind a collect;
/metrics and /gpu/peers read the Exporter's shared model (one collect for concurrent scrapes) on a
thread. Bad requests get a JSON error; nothing prints a traceback.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

import h11

from ..core.host.budgets import (
    SERVE_COLLECT_THREADS,
    SERVE_HEADER_DEADLINE_S,
    SERVE_MAX_CONNECTIONS,
    SERVE_MAX_HEADER_BYTES,
    SERVE_MAX_QUERY_CHARS,
    SERVE_REQUEST_DEADLINE_S,
)
from ..core.host.errors import GpushareError
from ..core.host.lifecycle import on_signals
from ..core.host.sockets import http_url
from .exporter import Exporter
from .exposition import CONTENT_TYPE
from .peers import peers_reply

MAX_CONNECTIONS = SERVE_MAX_CONNECTIONS
HEADER_DEADLINE_S = SERVE_HEADER_DEADLINE_S
REQUEST_DEADLINE_S = SERVE_REQUEST_DEADLINE_S
READ_CHUNK_BYTES = 4096
SERVER_NAME = "gpushare-tui"
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 18\r\n"
_BUSY += b"Connection: close\r\n\r\n" + b'{"error": "busy"}\n'
TEXT = "text/plain; charset=utf-8"
INDEX = b"gpushare-tui serve: /metrics /gpu/peers[?gpu_key=K] /healthz\n"

Reply = tuple[int, str, bytes]  # status, content type, body


def json_reply(status: int, doc: dict) -> Reply:
    return status, "application/json", (json.dumps(doc, allow_nan=False) + "\n").encode()


class _Conn:
    """One open connection: when it came, and whether it is still sending its request (evictable)."""

    __slots__ = ("since", "reading", "writer")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.since = time.monotonic()
        self.reading = True
        self.writer = writer


class ExporterServer:
    """A bound listening socket (bind errors are OSErrors here, before any loop) served by `serve_forever`."""

    def __init__(
        self,
        address: tuple[str, int],
        exporter: Exporter,
        *,
        max_connections: int = MAX_CONNECTIONS,
        header_deadline_s: float = HEADER_DEADLINE_S,
        deadline_s: float = REQUEST_DEADLINE_S,
    ) -> None:
        self.exporter = exporter
        self.max_connections = max_connections
        self.header_deadline_s = header_deadline_s
        self.deadline_s = deadline_s
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.create_server(address, family=family, backlog=128)
        self.server_address: tuple = self.socket.getsockname()
        self._conns: dict[asyncio.StreamWriter, _Conn] = {}
        self._pool = ThreadPoolExecutor(SERVE_COLLECT_THREADS, thread_name_prefix="serve-collect")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return http_url(str(host), port)

    # -- life -----------------------------------------------------------------------------------------

    def serve_forever(self, stop_signals: tuple[signal.Signals, ...] = ()) -> None:
        """Serve until `shutdown()` or one of `stop_signals` (main thread only); once it stops, those
        signals are ignored (it is stopping already)."""
        asyncio.run(self._main(stop_signals))

    async def _main(self, stop_signals: tuple[signal.Signals, ...]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        # Python handlers, not loop.add_signal_handler: the loop closes its wakeup pipe before it drops the
        # wakeup fd, so a signal in between printed "Exception ignored ... signal wakeup fd" and a traceback.
        on_signals(lambda _signum: self.shutdown(), stop_signals)
        server = await asyncio.start_server(self._client, sock=self.socket, limit=SERVE_MAX_HEADER_BYTES)
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            on_signals(lambda _signum: None, stop_signals)
            server.close()
            for c in list(self._conns.values()):
                c.writer.transport.abort()
            await server.wait_closed()

    def shutdown(self) -> None:
        """Stop serve_forever (from another thread, or a signal handler); a no-op once it stopped."""
        if self._loop is not None and self._stop is not None:
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:
                pass  # the loop is closed: stopped already

    def wait_started(self, timeout_s: float = 5.0) -> bool:
        return self._started.wait(timeout_s)

    def server_close(self) -> None:
        self.socket.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- one connection -------------------------------------------------------------------------------

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        """Room for a new connection: evict the oldest one still sending its request if full."""
        if len(self._conns) >= self.max_connections:
            reading = [c for c in self._conns.values() if c.reading]
            if not reading:
                return False
            oldest = min(reading, key=lambda c: c.since)
            oldest.writer.transport.abort()
            self._conns.pop(oldest.writer, None)
        self._conns[writer] = _Conn(writer)
        return True

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._admit(writer):
            writer.write(_BUSY)
            writer.transport.close()  # flushes what it can, never waits for the peer
            return
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=SERVE_MAX_HEADER_BYTES)
        t0 = time.monotonic()
        try:
            try:
                async with asyncio.timeout(self.header_deadline_s):
                    request = await self._read_request(reader, conn)
            except h11.RemoteProtocolError as e:
                status = e.error_status_hint if 400 <= e.error_status_hint < 600 else 400
                reply: Reply | None = json_reply(status, {"error": f"{HTTPStatus(status).phrase}: {str(e)[:200]}"})
                request = None
            else:
                reply = None
            if request is None and reply is None:
                return  # closed, or cut off at the header deadline
            c = self._conns.get(writer)
            if c is None:
                return  # evicted meanwhile
            c.reading = False
            async with asyncio.timeout(max(0.0, self.deadline_s - (time.monotonic() - t0))):
                head = request is not None and request.method == b"HEAD"
                if reply is None:
                    assert request is not None
                    if request.method not in (b"GET", b"HEAD"):
                        reply = json_reply(405, {"error": "only GET and HEAD"})
                    else:
                        reply = await self._route(request.target.decode("ascii", "replace"))
                await self._send(conn, writer, reply, head)
        except (TimeoutError, OSError, h11.ProtocolError):
            pass  # a slow, gone or broken client: nothing to report, nothing to print
        finally:
            self._conns.pop(writer, None)
            writer.transport.abort()

    async def _read_request(self, reader: asyncio.StreamReader, conn: h11.Connection) -> h11.Request | None:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Request):
                return event
            if event is h11.NEED_DATA:
                data = await reader.read(READ_CHUNK_BYTES)
                conn.receive_data(data)  # b"" is the peer's EOF
                continue
            return None  # ConnectionClosed (or anything but a request first)

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter, reply: Reply, head: bool) -> None:
        status, ctype, body = reply
        headers = [
            ("Server", SERVER_NAME),
            ("Content-Type", ctype),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
        ]
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        data = conn.send(h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase))
        if not head:
            data += conn.send(h11.Data(data=body))
        data += conn.send(h11.EndOfMessage())
        writer.write(data)
        await writer.drain()

    async def _route(self, target: str) -> Reply:
        url = urlsplit(target)
        if len(url.query) > SERVE_MAX_QUERY_CHARS:
            return json_reply(400, {"error": "query too long"})
        if url.path == "/healthz":
            return 200, TEXT, b"ok\n"
        if url.path == "/":
            return 200, TEXT, INDEX
        if url.path == "/metrics":
            return await self._off_loop(lambda: (200, CONTENT_TYPE, self.exporter.metrics()))
        if url.path == "/gpu/peers":
            keys = parse_qs(url.query).get("gpu_key")

            def peers() -> Reply:
                return json_reply(*peers_reply(keys, self.exporter.model, socket.gethostname()))

            return await self._off_loop(peers)
        return json_reply(404, {"error": f"not found: {url.path[:200]}"})

    async def _off_loop(self, work: Callable[[], Reply]) -> Reply:
        """`work` on a collect thread (the loop keeps answering /healthz meanwhile); its errors as a 500."""
        assert self._loop is not None
        try:
            return await self._loop.run_in_executor(self._pool, work)
        except (GpushareError, OSError, ValueError) as e:
            return json_reply(500, {"error": f"cannot read the segments: {e}"})
