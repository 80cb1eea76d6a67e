"""A front proxy on an engine's public port: sees each HTTP request arrive and its response end, so a
supervised llama-server's DEMAND (spec §7) is known within a fraction of a millisecond of both, with no
probing of an idle engine (bench/demand_detect.py measured why: see its docstring).

    proxy = FrontProxy(("127.0.0.1", public_port), ("127.0.0.1", engine_port), on_demand=membership.set_demand)
    proxy.start()            # bound at once (GpushareError if the port is taken); serves on its own thread
    ...
    proxy.close()

HTTP/1.1 only as far as framing goes: request and response bodies by Content-Length or chunked transfer
coding (what llama-server's streamed completions use), else a response ends when the engine closes the
connection; keep-alive connections carry one request after another; bytes are forwarded unchanged (a
request's head is not rewritten). A request is in flight from the end of its head to the end of its
response (or either side closing); a GET of NO_DEMAND_PATHS (a health check, a scrape) is no work.
`on_demand(True)` is called when the first request in flight arrives, `on_demand(False)` when the last
one ends, on the proxy's thread. Per-request timings (head received, first
response byte, response end; monotonic seconds) are kept for the benchmark and an exporter (`timings`).

Budgets on untrusted input: a request or response head holds at most MAX_HEAD_BYTES and must arrive
within HEAD_DEADLINE_S of the previous request's end (an idle keep-alive connection is closed after
IDLE_KEEPALIVE_S); a chunk-size line at most MAX_LINE_BYTES; anything malformed closes the connection
(the engine sees its side closed, as if the client went away)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..host.errors import GpushareError

MAX_HEAD_BYTES = 64 * 2**10
MAX_LINE_BYTES = 1024  # a chunk-size line (hex size, optional extensions)
HEAD_DEADLINE_S = 10.0
IDLE_KEEPALIVE_S = 60.0
UPSTREAM_CONNECT_S = 5.0
READ_CHUNK_BYTES = 64 * 2**10
TIMINGS_KEPT = 4096
# GETs that ask about the engine rather than give it work (health checks, scrapes, the dashboard's probes): no DEMAND
NO_DEMAND_PATHS = frozenset({"/health", "/metrics", "/slots", "/props", "/models", "/v1/models"})
LISTEN_BACKLOG = 128


class ProxyError(GpushareError):
    """The proxy could not be set up (its port taken, say); the message says which."""


class _Framing(Exception):
    """Malformed or over-budget HTTP framing: the connection is closed."""


@dataclass(frozen=True)
class RequestTiming:
    """One request through the proxy: monotonic seconds of its head received, the response's first byte
    (None: none came) and its end; its method and path as sent (untrusted text, for display only)."""

    start_s: float
    first_byte_s: float | None
    end_s: float
    method: str
    path: str
    status: int | None


@dataclass
class _Head:
    raw: bytes
    first_line: str
    headers: dict[str, str]  # lower-case names; a repeated one: the last


def _parse_head(raw: bytes) -> _Head:
    try:
        text = raw.decode("latin-1")
    except UnicodeDecodeError as e:  # pragma: no cover - latin-1 decodes any byte
        raise _Framing(str(e)) from None
    lines = text.split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _Framing(f"bad header line {line[:40]!r}")
        headers[name.lower()] = value.strip()
    return _Head(raw, lines[0], headers)


async def _read_head(reader: asyncio.StreamReader, deadline_s: float) -> _Head | None:
    """The next message head (up to and including its blank line); None at a clean EOF before any byte."""
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), deadline_s)
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise _Framing("connection closed inside a head") from None
    except asyncio.LimitOverrunError:
        raise _Framing(f"head larger than {MAX_HEAD_BYTES} bytes") from None
    except TimeoutError:
        raise _Framing("no head within the deadline") from None
    return _parse_head(raw)


def _content_length(head: _Head) -> int | None:
    value = head.headers.get("content-length")
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()):
        raise _Framing(f"bad Content-Length {value[:20]!r}")
    return int(value)


def _is_chunked(head: _Head) -> bool:
    return head.headers.get("transfer-encoding", "").lower().replace(" ", "").endswith("chunked")


async def _copy_exact(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int, on_data=None) -> None:
    while n > 0:
        data = await reader.read(min(n, READ_CHUNK_BYTES))
        if not data:
            raise _Framing("connection closed inside a body")
        n -= len(data)
        if on_data is not None:
            on_data()
        writer.write(data)
        await writer.drain()


class _ChunkedEnd:
    """Finds where a chunked body ends in the bytes fed to it, without copying them: chunk-size lines
    are parsed, chunk data is skipped by its length (one read and one write per arriving segment)."""

    def __init__(self) -> None:
        self.state = "size"  # size | data | trailer
        self.line = b""  # a line not complete yet
        self.left = 0  # bytes of chunk data (and its CRLF) still to come
        self.trailer_bytes = 0

    def feed(self, data: bytes) -> int | None:
        """The index just past the body's end in `data`, or None when it goes on; _Framing if malformed."""
        i, n = 0, len(data)
        while i < n:
            if self.state == "data":
                take = min(self.left, n - i)
                i += take
                self.left -= take
                if self.left == 0:
                    self.state = "size"
                continue
            j = data.find(b"\n", i)
            part = data[i:] if j < 0 else data[i : j + 1]
            self.line += part
            i += len(part)
            if len(self.line) > (MAX_LINE_BYTES if self.state == "size" else MAX_HEAD_BYTES):
                raise _Framing("chunk-size or trailer line too long")
            if j < 0:
                return None
            line, self.line = self.line, b""
            if self.state == "trailer":
                self.trailer_bytes += len(line)
                if self.trailer_bytes > MAX_HEAD_BYTES:
                    raise _Framing("trailers too long")
                if line in (b"\r\n", b"\n"):
                    return i
                continue
            size_text = line.strip().split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise _Framing(f"bad chunk size {size_text[:20]!r}") from None
            if size < 0 or not size_text.isalnum():
                raise _Framing("bad chunk size")
            self.state, self.left = ("trailer", 0) if size == 0 else ("data", size + 2)
        return None


async def _copy_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, on_data=None) -> None:
    """One chunked body, forwarded as it arrives (each SSE event of a streamed completion at once)."""
    parser = _ChunkedEnd()
    while True:
        data = await reader.read(READ_CHUNK_BYTES)
        if not data:
            raise _Framing("connection closed inside a chunked body")
        end = parser.feed(data)
        if on_data is not None:
            on_data()
        writer.write(data if end is None else data[:end])
        await writer.drain()
        if end is not None:
            if end < len(data):  # bytes beyond the message: we never pipeline, so the peer is not HTTP/1.1
                raise _Framing("data after the end of a chunked body")
            return


async def _copy_body(
    head: _Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, until_eof: bool, on_data=None
) -> bool:
    """Forward the body `head` announces; True when the connection may carry another message."""
    if _is_chunked(head):
        await _copy_chunked(reader, writer, on_data)
        return True
    length = _content_length(head)
    if length is not None:
        await _copy_exact(reader, writer, length, on_data)
        return True
    if not until_eof:
        return True  # a request without a body
    while data := await reader.read(READ_CHUNK_BYTES):  # a response delimited by the engine closing
        if on_data is not None:
            on_data()
        writer.write(data)
        await writer.drain()
    return False


def _status(head: _Head) -> int | None:
    parts = head.first_line.split(" ", 2)
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() and len(parts[1]) == 3 else None


class FrontProxy:
    """A reverse proxy from `listen` (host, port; port 0: any free one, see `port`) to `upstream`, counting
    requests in flight (`in_flight`) and calling `on_demand` at 0 -> 1 and 1 -> 0. Thread-safe to read."""

    def __init__(
        self,
        listen: tuple[str, int],
        upstream: tuple[str, int],
        *,
        on_demand: Callable[[bool], None] | None = None,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self.listen = listen
        self.upstream = upstream
        self._on_demand = on_demand
        self._clock = clock_s
        self.in_flight = 0
        self.requests_total = 0
        self.timings: deque[RequestTiming] = deque(maxlen=TIMINGS_KEPT)
        self.demand_changes: deque[tuple[float, bool]] = deque(maxlen=TIMINGS_KEPT)  # (monotonic s, demand)
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self.thread_native_id: int | None = None

    @property
    def port(self) -> int:
        assert self._sock is not None, "start() first"
        return self._sock.getsockname()[1]

    def start(self) -> FrontProxy:
        """Bind now (ProxyError if it cannot), then serve on a thread of its own."""
        sock = socket.socket(socket.AF_INET6 if ":" in self.listen[0] else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(self.listen)
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            raise ProxyError(
                f"front proxy cannot listen on {self.listen[0]}:{self.listen[1]}: {e.strerror or e}"
            ) from None
        self._sock = sock
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="gpushare-front-proxy", daemon=True)
        self._thread.start()
        ready.wait(5)
        return self

    def close(self) -> None:
        """Stop serving (connections in progress are cut). Idempotent."""
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopped.set)
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> FrontProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop thread --------------------------------------------------------------------------------

    def _run(self, ready: threading.Event) -> None:
        self.thread_native_id = threading.get_native_id()
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve(ready))
        finally:
            loop.close()

    async def _serve(self, ready: threading.Event) -> None:
        self._stopped = asyncio.Event()
        assert self._sock is not None
        server = await asyncio.start_server(self._client, sock=self._sock, limit=MAX_HEAD_BYTES)
        ready.set()
        async with server:
            await self._stopped.wait()
            server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _demand(self, delta: int) -> None:
        before, self.in_flight = self.in_flight, self.in_flight + delta
        if (before == 0) != (self.in_flight == 0):
            now = self._clock()
            self.demand_changes.append((now, self.in_flight > 0))
            if self._on_demand is not None:
                try:
                    self._on_demand(self.in_flight > 0)
                except Exception:  # a callback's failure must not take the proxy down
                    pass

    async def _client(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        _nodelay(cwriter)
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                try:
                    head = await _read_head(creader, IDLE_KEEPALIVE_S if upstream else HEAD_DEADLINE_S)
                except _Framing:
                    return
                if head is None:
                    return
                if upstream is not None and upstream[0].at_eof():  # the engine closed an idle keep-alive connection
                    upstream[1].close()
                    upstream = None
                if upstream is None:
                    upstream = await asyncio.wait_for(
                        asyncio.open_connection(*self.upstream, limit=MAX_HEAD_BYTES), UPSTREAM_CONNECT_S
                    )
                    _nodelay(upstream[1])
                if not await self._exchange(head, creader, cwriter, *upstream):
                    return
        except (OSError, TimeoutError, _Framing, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:  # close(): end quietly (3.11's start_server callback chokes on a cancelled task)
            return
        finally:
            for w in (cwriter, upstream[1] if upstream else None):
                if w is not None:
                    w.close()

    async def _exchange(
        self,
        head: _Head,
        creader: asyncio.StreamReader,
        cwriter: asyncio.StreamWriter,
        ureader: asyncio.StreamReader,
        uwriter: asyncio.StreamWriter,
    ) -> bool:
        """One request and its response; True when both connections may carry another."""
        start = self._clock()
        self.requests_total += 1
        parts = head.first_line.split(" ")
        work = not (parts[0] in ("GET", "HEAD") and len(parts) > 1 and parts[1].split("?", 1)[0] in NO_DEMAND_PATHS)
        if work:
            self._demand(+1)
        first: list[float] = []
        status: int | None = None
        try:
            uwriter.write(head.raw)
            await _copy_body(head, creader, uwriter, until_eof=False)
            await uwriter.drain()
            while True:
                rhead = await _read_head(ureader, IDLE_KEEPALIVE_S)
                if rhead is None:
                    return False
                if not first:
                    first.append(self._clock())
                status = _status(rhead)
                cwriter.write(rhead.raw)
                await cwriter.drain()
                if status is None or status >= 200 or status == 101:
                    break
            method = head.first_line.split(" ", 1)[0]
            if method == "HEAD" or status in (204, 304):
                more = True
            else:
                more = await _copy_body(rhead, ureader, cwriter, until_eof=True)
            close = "close" in (head.headers.get("connection", "") + rhead.headers.get("connection", "")).lower()
            return more and not close and status != 101
        finally:
            self.timings.append(
                RequestTiming(
                    start,
                    first[0] if first else None,
                    self._clock(),
                    parts[0][:16],
                    parts[1][:200] if len(parts) > 1 else "",
                    status,
                )
            )
            if work:
                self._demand(-1)


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
