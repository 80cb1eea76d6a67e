"""A front proxy on an engine's public port: sees each HTTP request arrive and its response end, so a
supervised llama-server's DEMAND (spec §7) is known within a fraction of a millisecond of both, with no
probing of an idle engine (bench/demand_detect.py measured why: see its docstring).

    proxy = FrontProxy(("127.0.0.1", public_port), ("127.0.0.1", engine_port), on_demand=membership.set_demand)
    proxy.start()            # bound at once (GpushareError if the port is taken); serves on its own thread
    ...
    proxy.close()

HTTP/1.1 is framed by h11 on both sides (each client connection an h11 server, its engine connection an
h11 client): pipelined requests are answered one after another in order, request and response bodies by
Content-Length, chunked coding (trailers kept) or the engine closing; `Expect: 100-continue` is passed on
and the engine's `100 Continue` relayed; HTTP/1.0 clients are answered as HTTP/1.0 wants (h11 re-frames);
an `Upgrade` is not passed on (the engine answers the request as a plain one), CONNECT gets 405. Hop-by-hop
headers (Connection, Keep-Alive, Upgrade, TE, Proxy-Connection) stay on their hop; the rest pass unchanged.
A client half-closing (EOF after its last request) is passed on as a half-close once that request is sent,
so the engine sees what it would see direct (llama-server cancels a non-streamed completion then).

DEMAND is "the engine has work": a request counts from the end of its body (its head, when it has none) to
the end of its response, or either side closing; a GET/HEAD of NO_DEMAND_PATHS (a health check, a scrape) is
no work. `on_demand(True)` is called when the first request in flight arrives, `on_demand(False)` when the
last one ends, on the proxy's thread. Per-request timings (head received, first response byte, response
end; monotonic seconds) are kept for the benchmark and an exporter (`timings`).

With `seed_view` (the engine's GPU entry, spec §5), the proxy answers `GET /gpu/peers` itself and adds
`"opencoti": {"gpu_share": {enabled, gpu_key, self, peers, ...}}` to a JSON-object reply of `GET /props`,
the rest of its bytes unchanged (a reply that is not a JSON object, already has "opencoti", or is larger
than PROXY_PROPS_MAX_BYTES passes through as it came).

Budgets on untrusted input (core/host/budgets.py, PROXY_*; docs/trust.md "The front proxy"): heads, the
time to send one, idle keep-alive, a stalled body, read-ahead of pipelined requests, connections (below
the fd limit, with headroom). None bounds the engine's reply: it is awaited while both connections stay
open. Malformed framing gets h11's 4xx (when no response has begun) and the connection is closed."""

from __future__ import annotations

import asyncio
import errno
import json
import resource
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h11

from ..host.budgets import (
    PROXY_ACCEPT_BACKOFF_S,
    PROXY_BODY_IDLE_S,
    PROXY_FD_HEADROOM,
    PROXY_HEAD_DEADLINE_S,
    PROXY_IDLE_KEEPALIVE_S,
    PROXY_MAX_CONNECTIONS,
    PROXY_MAX_HEAD_BYTES,
    PROXY_PIPELINE_BUFFER_BYTES,
    PROXY_PROPS_MAX_BYTES,
    PROXY_SEED_VIEW_MAX_AGE_S,
    PROXY_UPSTREAM_CONNECT_S,
)
from ..host.errors import GpushareError

MAX_HEAD_BYTES = PROXY_MAX_HEAD_BYTES
READ_CHUNK_BYTES = 64 * 2**10
TIMINGS_KEPT = 4096
# GETs that ask about the engine rather than give it work (health checks, scrapes, the dashboard's probes): no DEMAND
NO_DEMAND_PATHS = frozenset({"/health", "/metrics", "/slots", "/props", "/models", "/v1/models", "/gpu/peers"})
LISTEN_BACKLOG = 128
# An engine connection idle longer than this is not reused: llama-server (cpp-httplib) closes one idle for 5 s,
# and a request sent as it closes would be lost; a new localhost connection costs ~0.1 ms.
UPSTREAM_REUSE_IDLE_S = 2.0
PEERS_PATH = "/gpu/peers"
PROPS_PATH = "/props"
# hop-by-hop (RFC 9110 §7.6.1): never passed on; h11 writes each hop's own framing and Connection
HOP_HEADERS = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"upgrade"})
FD_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class ProxyError(GpushareError):
    """The proxy could not be set up (its port taken, say); the message says which."""


class _Cut(Exception):
    """A client or the engine broke the exchange (bad framing, a budget spent, a side closed): the
    connection is closed, after `status` (a 4xx/5xx) when no response has begun and one is due."""

    def __init__(self, why: str, status: int | None = None) -> None:
        super().__init__(why)
        self.status = status


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


def connection_cap(max_connections: int = PROXY_MAX_CONNECTIONS) -> int:
    """Client connections open at once: `max_connections`, less when the soft fd limit is lower (2 fds each,
    PROXY_FD_HEADROOM kept for the rest of the process)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, (soft - PROXY_FD_HEADROOM) // 2))


def hop_filtered(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` (raw name, value) less the hop-by-hop ones and any that Connection names."""
    named = {t.strip().lower() for n, v in headers if n.lower() == b"connection" for t in v.split(b",")}
    return [(n, v) for n, v in headers if n.lower() not in HOP_HEADERS and n.lower() not in named]


def with_gpu_share(body: bytes, block: dict) -> bytes | None:
    """`body` (a JSON object) with `"opencoti": {"gpu_share": block}` added before its closing brace, every
    other byte unchanged; None when it is not a JSON object or already has an "opencoti" key."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or "opencoti" in doc:
        return None
    end = body.rstrip().rfind(b"}")  # a JSON object's text ends with its closing brace
    added = b'"opencoti": ' + json.dumps({"gpu_share": block}, allow_nan=False).encode()
    return body[:end] + (b", " if doc else b"") + added + body[end:]


class _Client:
    """One accepted connection: its h11 server side, its engine connection (opened at its first request)
    and since when it has had no request in flight (None while one is: not evictable)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, now_s: float) -> None:
        self.h = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.reader, self.writer = reader, writer
        self.evictable_since: float | None = now_s
        self.up: _Upstream | None = None
        self.task: asyncio.Task | None = None
        self.served = 0
        self.out = bytearray()  # bytes for the client not written yet: one write per engine read

    def buffered(self) -> int:
        return len(self.h.trailing_data[0])


class _Upstream:
    """A connection to the engine, an h11 client: reused while both sides keep it alive."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, now_s: float) -> None:
        self.h = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.reader, self.writer = reader, writer
        self.idle_since_s = now_s
        self.half_closed = False

    def reusable(self, now_s: float) -> bool:
        h = self.h
        return (
            h.our_state is h11.IDLE
            and h.their_state is h11.IDLE
            and not self.half_closed
            and not self.reader.at_eof()
            and now_s - self.idle_since_s < UPSTREAM_REUSE_IDLE_S
        )

    async def send(self, event: Any) -> None:
        data = self.h.send(event)
        if data:
            self.writer.write(data)
            await self.writer.drain()

    def poll(self) -> Any:
        """The engine's next event already received, or h11.NEED_DATA."""
        try:
            return self.h.next_event()
        except h11.RemoteProtocolError as e:
            raise _Cut(f"engine: {e}", 502) from None

    async def fill(self) -> None:
        """Receive what the engine sends next; no deadline (see the module's docstring)."""
        try:
            data = await self.reader.read(READ_CHUNK_BYTES)
        except OSError as e:
            raise _Cut(f"engine: {e}", 502) from None
        self.h.receive_data(data)

    def close(self) -> None:
        self.writer.close()


class FrontProxy:
    """A reverse proxy from `listen` (host, port; port 0: any free one, see `port`) to `upstream`, counting
    requests in flight (`in_flight`) and calling `on_demand` at 0 -> 1 and 1 -> 0. Thread-safe to read.

    `seed_view`: the engine's GPU entry (`{gpu_key, period_ms, self, peers, ...}`), called on a worker
    thread at most once per PROXY_SEED_VIEW_MAX_AGE_S; None: /gpu/peers and /props go to the engine as is.
    `idle_keepalive_s`, `body_idle_s`, `max_connections`: the budgets (tests make them small). `on_error`:
    told one line the first time each kind of unexpected exception (a bug) ends a connection or an accept."""

    def __init__(
        self,
        listen: tuple[str, int],
        upstream: tuple[str, int],
        *,
        on_demand: Callable[[bool], None] | None = None,
        clock_s: Callable[[], float] = time.monotonic,
        seed_view: Callable[[], dict] | None = None,
        idle_keepalive_s: float = PROXY_IDLE_KEEPALIVE_S,
        body_idle_s: float = PROXY_BODY_IDLE_S,
        max_connections: int = PROXY_MAX_CONNECTIONS,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.listen = listen
        self._on_error = on_error
        self.errors_total = 0  # unexpected exceptions (a bug): each connection's ends it alone, never the proxy
        self._errors_said: set[str] = set()
        self.upstream = upstream
        self._on_demand = on_demand
        self._clock = clock_s
        self._seed_view = seed_view
        self.idle_keepalive_s = idle_keepalive_s
        self.body_idle_s = body_idle_s
        self.max_connections = connection_cap(max_connections)
        self.in_flight = 0
        self.requests_total = 0
        self.evicted_total = 0  # connections closed at the cap to make room for a newcomer
        self.timings: deque[RequestTiming] = deque(maxlen=TIMINGS_KEPT)
        self.demand_changes: deque[tuple[float, bool]] = deque(maxlen=TIMINGS_KEPT)  # (monotonic s, demand)
        self._clients: set[_Client] = set()
        self._open = 0  # accepted and not ended (a connection counts from its accept, before it is a _Client)
        self._room: asyncio.Event | None = None
        self._seed_cache: tuple[float, dict] | None = None
        self._seed_pending: asyncio.Future | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self.thread_native_id: int | None = None

    @property
    def port(self) -> int:
        assert self._sock is not None, "start() first"
        return self._sock.getsockname()[1]

    @property
    def connections(self) -> int:
        """Client connections open now (accepted, not yet ended)."""
        return self._open

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
            try:
                loop.call_soon_threadsafe(stopped.set)
            except RuntimeError:  # the loop closed meanwhile
                pass
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
        self._room = asyncio.Event()
        accept = asyncio.create_task(self._accept_loop())
        ready.set()
        await self._stopped.wait()
        accept.cancel()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _accept_loop(self) -> None:
        """Accept while below the cap; at it, make room by closing the oldest connection with no request in
        flight once a newcomer waits, else leave newcomers in the backlog until a connection ends."""
        loop = asyncio.get_running_loop()
        sock, room = self._sock, self._room
        assert sock is not None and room is not None
        while True:
            if self._open >= self.max_connections:
                await _readable(loop, sock)  # a newcomer waits in the backlog
                if self._open >= self.max_connections:
                    room.clear()
                    if not self._evict():
                        # accepts that did not wait leave their clients' tasks unstarted (not yet evictable):
                        # let them run once, else newcomers wait for a head deadline (measured: 29 s for 400)
                        await asyncio.sleep(0)
                        self._evict()
                    await room.wait()  # the evicted one's end, or any other's
                continue
            try:
                conn, _addr = await loop.sock_accept(sock)
            except OSError as e:  # out of fds after all (another thread's), an aborted handshake
                if e.errno in FD_ERRNOS:
                    await asyncio.sleep(PROXY_ACCEPT_BACKOFF_S)
                continue
            except Exception as e:  # a bug: said, and the port keeps accepting
                self._unexpected("accept", e)
                await asyncio.sleep(PROXY_ACCEPT_BACKOFF_S)
                continue
            self._open += 1
            asyncio.create_task(self._client(conn))

    def _evict(self) -> bool:
        """Close the client connection with no request in flight for longest; False when every one has one."""
        idle = [c for c in self._clients if c.evictable_since is not None and c.task is not None]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.evictable_since or 0.0)
        oldest.evictable_since = None
        assert oldest.task is not None
        oldest.task.cancel()
        self.evicted_total += 1
        return True

    def _unexpected(self, where: str, e: Exception) -> None:
        self.errors_total += 1
        kind = f"{where}: {type(e).__name__}"
        if kind not in self._errors_said and self._on_error is not None:
            self._errors_said.add(kind)
            try:
                self._on_error(f"unexpected error in {kind}: {e} (the proxy serves on)")
            except Exception:
                pass

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

    async def _client(self, conn: socket.socket) -> None:
        try:
            await self._serve_client(conn)
        finally:
            self._open -= 1
            if self._room is not None:
                self._room.set()

    async def _serve_client(self, conn: socket.socket) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        try:
            reader, writer = await asyncio.open_connection(sock=conn, limit=MAX_HEAD_BYTES)
        except (OSError, asyncio.CancelledError):
            conn.close()
            return
        cl = _Client(reader, writer, self._clock())
        cl.task = asyncio.current_task()
        self._clients.add(cl)
        try:
            while True:
                req = await self._next_request(cl)
                if req is None:
                    return
                cl.evictable_since = None
                if not await self._exchange(cl, req):
                    return
                cl.served += 1
                if cl.h.our_state is not h11.DONE or cl.h.their_state is not h11.DONE:
                    return
                cl.h.start_next_cycle()
                cl.evictable_since = self._clock()
                if self._room is not None:  # a newcomer waiting at the cap may now take its place
                    self._room.set()
        except _Cut as e:
            if e.status is not None and cl.h.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await _answer(cl, e.status, {"error": str(e)}, close=True)
        except (OSError, h11.ProtocolError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # close() or an eviction: end quietly
            pass
        except Exception as e:  # a bug: this connection ends, the proxy serves on
            self._unexpected("a connection", e)
        finally:
            self._clients.discard(cl)
            if cl.up is not None:
                cl.up.close()
            writer.close()

    async def _next_request(self, cl: _Client) -> h11.Request | None:
        """The next request head: a new connection's within PROXY_HEAD_DEADLINE_S of its accept, a kept-alive
        one's first byte within the idle budget and the rest within PROXY_HEAD_DEADLINE_S of it. None when the
        client ends (or idles out) between requests; a head begun and not finished in time gets 408."""
        started = self._clock()
        head_until: float | None = None if cl.served else started + PROXY_HEAD_DEADLINE_S
        wait_until = started + self.idle_keepalive_s
        while True:
            try:
                ev = cl.h.next_event()
            except h11.RemoteProtocolError as e:
                raise _Cut(str(e), e.error_status_hint) from None
            if isinstance(ev, h11.Request):
                return ev
            if isinstance(ev, h11.ConnectionClosed):
                return None
            if ev is not h11.NEED_DATA:  # PAUSED cannot be: the cycle was started
                raise _Cut(f"unexpected {type(ev).__name__}")
            now = self._clock()
            if head_until is None and cl.buffered():  # a pipelined head begun
                head_until = now + PROXY_HEAD_DEADLINE_S
            left = (head_until if head_until is not None else wait_until) - now
            try:
                if left <= 0:
                    raise TimeoutError
                data = await asyncio.wait_for(cl.reader.read(READ_CHUNK_BYTES), left)
            except TimeoutError:
                if cl.buffered():
                    raise _Cut("no complete request head within the deadline", 408) from None
                return None  # idle: closed quietly
            if data and head_until is None:
                head_until = self._clock() + PROXY_HEAD_DEADLINE_S
            cl.h.receive_data(data)

    async def _client_event(self, cl: _Client) -> Any:
        """The client's next body event (Data, EndOfMessage): each read within the body-idle budget."""
        while True:
            try:
                ev = cl.h.next_event()
            except h11.RemoteProtocolError as e:
                raise _Cut(str(e), e.error_status_hint) from None
            if ev is not h11.NEED_DATA:
                return ev
            try:
                data = await asyncio.wait_for(cl.reader.read(READ_CHUNK_BYTES), self.body_idle_s)
            except TimeoutError:
                raise _Cut(f"request body stalled for {self.body_idle_s:g} s", 408) from None
            cl.h.receive_data(data)

    async def _upstream(self, cl: _Client) -> _Upstream:
        up = cl.up
        if up is not None and up.reusable(self._clock()):
            return up
        if up is not None:
            up.close()
            cl.up = None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(*self.upstream, limit=MAX_HEAD_BYTES), PROXY_UPSTREAM_CONNECT_S
            )
        except (OSError, TimeoutError) as e:
            raise _Cut(f"engine unreachable: {e}", 502) from None
        _nodelay(writer)
        cl.up = _Upstream(reader, writer, self._clock())
        return cl.up

    async def _exchange(self, cl: _Client, req: h11.Request) -> bool:
        """One request and its response; True when the client connection may carry another."""
        start = self._clock()
        self.requests_total += 1
        method = req.method.decode("latin-1")
        target = req.target.decode("latin-1")
        path = target.split("?", 1)[0]
        work = not (method in ("GET", "HEAD") and path in NO_DEMAND_PATHS)
        ex = _Exchange(start)
        try:
            if method == "CONNECT":
                await _answer(cl, 405, {"error": "CONNECT is not supported"}, close=True)
                return False
            if self._seed_view is not None and method in ("GET", "HEAD") and path == PEERS_PATH:
                await self._discard_body(cl)
                ex.first_byte_s, ex.status = self._clock(), 200
                await _answer(cl, 200, await self._seed(), head_only=method == "HEAD")
                return True
            props = self._seed_view is not None and method == "GET" and path == PROPS_PATH
            return await self._forward(cl, req, work, props, ex)
        finally:
            if ex.demand:
                self._demand(-1)
            self.timings.append(
                RequestTiming(start, ex.first_byte_s, self._clock(), method[:16], target[:200], ex.status)
            )

    async def _discard_body(self, cl: _Client) -> None:
        """Read (and drop) a request body we answer ourselves, at most PROXY_PIPELINE_BUFFER_BYTES of it."""
        n = 0
        while not isinstance(ev := await self._client_event(cl), h11.EndOfMessage):
            n += len(ev.data)
            if n > PROXY_PIPELINE_BUFFER_BYTES:
                raise _Cut("request body too large", 413)

    async def _forward(self, cl: _Client, req: h11.Request, work: bool, props: bool, ex: _Exchange) -> bool:
        up = await self._upstream(cl)
        headers = hop_filtered(list(req.headers.raw_items()))
        if not any(n.lower() == b"host" for n, _v in headers):
            headers.append((b"Host", f"{self.upstream[0]}:{self.upstream[1]}".encode()))
        try:  # the head and as much of the body as came with it, in one write
            out = bytearray(up.h.send(h11.Request(method=req.method, target=req.target, headers=headers)))
            complete = False
            while not complete and (ev := _client_poll(cl)) is not h11.NEED_DATA:
                out += up.h.send(_body_event(ev))
                complete = isinstance(ev, h11.EndOfMessage)
            up.writer.write(out)
            await up.writer.drain()
        except (OSError, h11.LocalProtocolError) as e:
            raise _Cut(f"engine: {e}", 502) from None
        if complete:
            self._body_done(work, ex)
        body = asyncio.create_task(self._pump_body(cl, up, work, ex, complete))
        reply = asyncio.create_task(self._pump_reply(cl, up, req, props, ex))
        try:
            pending = {body, reply}
            while reply in pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if body in done and body.exception() is not None:
                    raise body.exception()  # type: ignore[misc]
            reply.result()
        finally:
            for task in (body, reply):
                if not task.done():
                    task.cancel()
            await asyncio.gather(body, reply, return_exceptions=True)
        up.idle_since_s = self._clock()
        if up.h.our_state is h11.DONE and up.h.their_state is h11.DONE:
            up.h.start_next_cycle()
        else:
            up.close()
            cl.up = None
        return cl.h.their_state is h11.DONE

    def _body_done(self, work: bool, ex: _Exchange) -> None:
        if work:
            self._demand(+1)
            ex.demand = True

    async def _pump_body(self, cl: _Client, up: _Upstream, work: bool, ex: _Exchange, complete: bool) -> None:
        """The rest of the request's body to the engine (unless `complete`); DEMAND from its end. Then the
        client is read ahead (at most PROXY_PIPELINE_BUFFER_BYTES, its next pipelined requests) until the reply
        ends; its EOF, with nothing more to send, is passed on to the engine as a half-close."""
        while not complete:
            ev = _body_event(await self._client_event(cl))
            try:
                await up.send(ev)
            except (OSError, h11.LocalProtocolError) as e:
                raise _Cut(f"engine: {e}", 502) from None
            if isinstance(ev, h11.EndOfMessage):
                self._body_done(work, ex)
                complete = True
        while cl.buffered() < PROXY_PIPELINE_BUFFER_BYTES:
            data = await cl.reader.read(READ_CHUNK_BYTES)
            cl.h.receive_data(data)
            if not data:
                if not cl.buffered():
                    up.half_closed = True
                    try:
                        up.writer.write_eof()
                    except OSError:
                        pass
                return
        await asyncio.Event().wait()  # read ahead in full: back-pressure until the reply ends

    async def _pump_reply(self, cl: _Client, up: _Upstream, req: h11.Request, props: bool, ex: _Exchange) -> None:
        """The engine's response to the client: 1xx relayed (an HTTP/1.0 client gets none), the head, the
        body as it comes (each chunk of a stream at once); a /props reply to `props` with gpu_share added."""
        held: tuple[h11.Response, list[bytes]] | None = None
        while True:
            ev = up.poll()
            if ev is h11.NEED_DATA:
                await _flush(cl)
                await up.fill()
                continue
            if ex.first_byte_s is None:
                ex.first_byte_s = self._clock()
            if isinstance(ev, h11.InformationalResponse):
                if ev.status_code == 101:
                    raise _Cut("engine switched protocols unasked", 502)
                if req.http_version != b"1.0":
                    _emit(cl, h11.InformationalResponse(
                        status_code=ev.status_code, headers=hop_filtered(list(ev.headers.raw_items())), reason=ev.reason
                    ))  # fmt: skip
                continue
            if isinstance(ev, h11.Response):
                ex.status = ev.status_code
                head = h11.Response(
                    status_code=ev.status_code, headers=hop_filtered(list(ev.headers.raw_items())), reason=ev.reason
                )
                if props and ev.status_code == 200:
                    held = (head, [])
                else:
                    _emit(cl, head)
                continue
            if isinstance(ev, h11.Data):
                if held is None:
                    _emit(cl, h11.Data(data=ev.data))
                    continue
                held[1].append(bytes(ev.data))
                if sum(map(len, held[1])) > PROXY_PROPS_MAX_BYTES:  # too large to parse: as it came
                    _release(cl, *held)
                    held = None
                continue
            if isinstance(ev, h11.EndOfMessage):
                if held is not None:
                    body = b"".join(held[1])
                    added = with_gpu_share(body, {"enabled": True, **await self._seed()})
                    if added is None:
                        _release(cl, *held)
                    else:
                        _emit(cl, _with_length(held[0], len(added)))
                        _emit(cl, h11.Data(data=added))
                trailers = hop_filtered(list(ev.headers.raw_items())) if req.http_version != b"1.0" else []
                _emit(cl, h11.EndOfMessage(headers=trailers))  # an HTTP/1.0 reply has no chunks to trail
                await _flush(cl)
                return
            raise _Cut("engine closed before its reply", 502)  # ConnectionClosed

    async def _seed(self) -> dict:
        """The engine's GPU entry, read on a worker thread at most once per PROXY_SEED_VIEW_MAX_AGE_S
        (concurrent requests share one read)."""
        view = self._seed_view
        assert view is not None
        now = self._clock()
        if self._seed_cache is not None and now - self._seed_cache[0] < PROXY_SEED_VIEW_MAX_AGE_S:
            return self._seed_cache[1]
        if self._seed_pending is None or self._seed_pending.done():
            self._seed_pending = asyncio.get_running_loop().run_in_executor(None, view)
        pending = self._seed_pending
        try:
            doc = await asyncio.shield(pending)
        except Exception as e:  # a segment that cannot be read is said, not raised
            doc = {"error": f"cannot read the segment: {e}"}
        finally:
            if self._seed_pending is pending and pending.done():
                self._seed_pending = None
        self._seed_cache = (now, doc)
        return doc


@dataclass
class _Exchange:
    start_s: float
    first_byte_s: float | None = None
    status: int | None = None
    demand: bool = False


def _with_length(head: h11.Response, n: int) -> h11.Response:
    headers = [
        (k, v) for k, v in head.headers.raw_items() if k.lower() not in (b"content-length", b"transfer-encoding")
    ]
    return h11.Response(
        status_code=head.status_code, headers=[*headers, (b"Content-Length", b"%d" % n)], reason=head.reason
    )


def _emit(cl: _Client, event: Any) -> None:
    """`event` for the client, written at the next _flush."""
    data = cl.h.send(event)
    if data:
        cl.out += data


async def _flush(cl: _Client) -> None:
    if cl.out:
        cl.writer.write(bytes(cl.out))
        cl.out.clear()
        await cl.writer.drain()


async def _write(cl: _Client, event: Any) -> None:
    _emit(cl, event)
    await _flush(cl)


def _release(cl: _Client, head: h11.Response, parts: list[bytes]) -> None:
    """A held reply as it came."""
    _emit(cl, head)
    for part in parts:
        _emit(cl, h11.Data(data=part))


def _client_poll(cl: _Client) -> Any:
    try:
        return cl.h.next_event()
    except h11.RemoteProtocolError as e:
        raise _Cut(str(e), e.error_status_hint) from None


def _body_event(ev: Any) -> Any:
    """A request body's event as the engine is sent it (its trailers less the hop-by-hop ones)."""
    if isinstance(ev, h11.Data):
        return ev
    if isinstance(ev, h11.EndOfMessage):
        return h11.EndOfMessage(headers=hop_filtered(list(ev.headers.raw_items())))
    raise _Cut(f"unexpected {type(ev).__name__} in a request body", 400)


async def _answer(cl: _Client, status: int, doc: dict, *, head_only: bool = False, close: bool = False) -> None:
    """A JSON reply of our own (no response may have begun)."""
    body = (json.dumps(doc, allow_nan=False) + "\n").encode()
    headers = [(b"Content-Type", b"application/json"), (b"Content-Length", b"%d" % len(body))]
    if close:
        headers.append((b"Connection", b"close"))
    try:
        await _write(cl, h11.Response(status_code=status, headers=headers))
        await _write(cl, h11.Data(data=b"" if head_only else body))
        await _write(cl, h11.EndOfMessage())
    except (OSError, h11.LocalProtocolError):
        pass


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(sock.fileno(), ready)
    try:
        await fut
    finally:
        loop.remove_reader(sock.fileno())


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
