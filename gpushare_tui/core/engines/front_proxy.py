"""A front proxy on an engine's public port: sees each HTTP request arrive and its response end, so a
supervised llama-server's DEMAND (spec §7) is known within a fraction of a millisecond of both, with no
probing of an idle engine (bench/demand_detect.py measured why: see its docstring).

    proxy = FrontProxy(("127.0.0.1", public_port), ("127.0.0.1", engine_port), on_demand=membership.set_demand)
    proxy.start()            # bound at once (ProxyError if the port is taken); serves on its own thread
    proxy.set_engine_ready() # requests wait (at most PROXY_ENGINE_WAIT_S) until the engine can take them
    ...
    proxy.close()

`sock`: a listening socket handed down (by `up`, or systemd: core/host/listen_fds.py) instead of binding:
connections that arrive while no supervisor runs wait in its backlog, and those that arrive while the
engine loads wait here, so a restart refuses nobody. While the engine is not ready, `GET /health` is
answered 503 "Loading model" at once (what llama-server answers while it loads).

Heads are parsed by llhttp (httptools, C: what uvicorn uses), a client's requests (`_RequestReader`) and the
engine's responses (`parse_response_head`) alike; what the proxy writes (the request to the engine, the response
head to the client) is their parts joined, not checked again, framed as h11 framed them before (bench/proxy.py: h11
on both sides made ~680 of a request's ~1,210 Python calls; without it a request costs the proxy a third less CPU).
Pipelined requests are answered one after another in order, request bodies by Content-Length or chunked coding
(trailers kept); `Expect: 100-continue` is passed on and the engine's `100 Continue` relayed; an `Upgrade` is not
passed on (the engine answers the request as a plain one; one with a body gets 400: llhttp reads none after it),
CONNECT gets 405. What llhttp refuses gets 400 (431: a head over MAX_HEAD_BYTES; 501: a transfer coding other than
chunked, as h11 answered): Content-Length beside Transfer-Encoding, two lengths, obs-fold, bare-LF line ends, an
HTTP/1.1 request without one Host. Hop-by-hop headers (Connection, Keep-Alive, Upgrade, TE, Proxy-Connection) stay
on their hop; the rest pass unchanged. A client half-closing (EOF after its last request) is passed on as a
half-close once that request is sent, so the engine sees what it would see direct (llama-server cancels a
non-streamed completion then).

The response's body is relayed as the engine's reads come, on the event loop's callback (`_Relay.feed`: no task
wakes per chunk, one write per read): a chunked body to an HTTP/1.1 client (every stream) passes unchanged, its
chunk-size lines scanned (never re-encoded) to find its end (a read that is one whole chunk, a token's usual
read, is checked and written in one step); the last chunk and trailers (hop-by-hop ones dropped) are written
at its end. A stream goes to the C relay (core/engines/_relay.c: a thread with its own epoll, no interpreter
lock) at its first chunk boundary, its response head written: the per-token Python was most of what the proxy
cost a stream (~35 µs of CPU a token at one stream, nginx's whole cost ~14), and the wake-up of the loop for
the first token most of the rest of what a request cost but its head. It keeps the reads for the latency
recorder until the recorder has found the first token in them (by its rule: `LatencyRecorder.chunk`); it
writes a last chunk without trailers itself (the reply's end); it gives the stream back at trailers, at
anything it does not check itself, or at the engine's EOF, and this scan goes on where it stopped. A whole
request on a new engine connection (every stream: llama-server closes a stream's connection) goes to the C relay
from its connect (`_request_in_c`): it writes the request, reads the response head and, where the head is plain,
writes it to the client as `_Client.response_head` would and relays the body, the loop woken only at the reply's
end; any other head comes to the loop with the engine's socket, read here as its own. Other bodies
go to the client a read at a time, framed for it (`_Client.body`): as they came with a Content-Length, chunked
to HTTP/1.1 when the engine delimits the body by closing, delimited by closing to HTTP/1.0 (with `Connection:
close`). The loop is uvloop's (libuv, C). Per-request and per-chunk accounting belongs where `_Exchange` and
`_Relay.feed` already are (one clock read there costs ~0.1 µs).

A new connection is served from its accept's callback: its first bytes are read there, and a request whole in
them goes to the C relay before the loop makes the socket a transport (`_Conn.attach`, then: the transport and
the task that serves the connection cost the loop ~100 µs, on the request's way before).

DEMAND is "the engine has work": a request counts from the end of its body (its head, when it has none; one the
C relay makes, from when it has it) to the end of its response, or either side closing; a GET/HEAD of
NO_DEMAND_PATHS (a health check, a scrape) is no work. `on_demand(True)` is called when the first request in
flight arrives, `on_demand(False)` DEMAND_FALL_GRACE_S after the last one ended if none came meanwhile, on the
proxy's thread. Per-request timings (head received, first response byte, response end; monotonic seconds) are
kept for the benchmark and an exporter (`timings`).

With `seed_view` (the engine's GPU entry, spec §5), the proxy answers `GET /gpu/peers` itself and adds
`"opencoti": {"gpu_share": {enabled, gpu_key, self, peers, ...}}` to a JSON-object reply of `GET /props`,
the rest of its bytes unchanged (a reply that is not a JSON object, already has "opencoti", or is larger
than PROXY_PROPS_MAX_BYTES passes through as it came).

Budgets on untrusted input (core/host/budgets.py, PROXY_*; docs/trust.md "The front proxy"): heads (a
response's chunk-size lines and trailers too), the time to send one, idle keep-alive, a stalled body,
read-ahead of pipelined requests, connections (below the fd limit, with headroom), the wait for a loading
engine. None bounds the engine's reply: it is awaited while both connections stay open. Malformed framing
gets a 4xx (when no response has begun) and the connection is closed; an engine's malformed head gets the
client a 502, its malformed chunked body ends the client's connection where it went wrong (what came before
it was relayed)."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import os
import re
import resource
import socket
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

import httptools
import uvloop

from ..host.budgets import (
    PROXY_ACCEPT_BACKOFF_S,
    PROXY_ACCEPTS_PER_WAKE,
    PROXY_BODY_IDLE_S,
    PROXY_ENGINE_WAIT_S,
    PROXY_FD_HEADROOM,
    PROXY_HEAD_DEADLINE_S,
    PROXY_IDLE_KEEPALIVE_S,
    PROXY_MAX_CONNECTIONS,
    PROXY_MAX_HEAD_BYTES,
    PROXY_PIPELINE_BUFFER_BYTES,
    PROXY_PROPS_MAX_BYTES,
    PROXY_RELAY_HOLD_MAX_BYTES,
    PROXY_RELAY_OUT_MAX_BYTES,
    PROXY_RELAY_TIMES_FLUSH_S,
    PROXY_RESEND_MAX_BYTES,
    PROXY_SEED_VIEW_MAX_AGE_S,
    PROXY_UPSTREAM_CONNECT_S,
)
from ..host.errors import GpushareError
from ..host.listen_fds import ListenFdError, bind_listening
from ..observe.latency import NOT_TOKENS, STREAM_CONTENT_TYPES, LatencyRecorder, Request, is_stream_content_type

try:  # the per-token relay in C (setup.py builds it where a compiler is; else streams are relayed on the loop)
    from . import _relay
except ImportError:  # pragma: no cover - a build without it
    _relay = None  # type: ignore[assignment]

MAX_HEAD_BYTES = PROXY_MAX_HEAD_BYTES
TIMINGS_KEPT = 4096
# GETs that ask about the engine rather than give it work (health checks, scrapes, the dashboard's probes): no DEMAND
NO_DEMAND_PATHS = frozenset({"/health", "/metrics", "/slots", "/props", "/models", "/v1/models", "/gpu/peers"})
LISTEN_BACKLOG = 128
# An engine connection idle longer than this is not reused: llama-server (cpp-httplib) closes one idle for 5 s,
# and a request sent as it closes would be lost; a new localhost connection costs ~0.1 ms.
UPSTREAM_REUSE_IDLE_S = 2.0
# Engine connections kept for the next client when theirs leaves (as nginx's `keepalive`): a client that opens
# a connection per request costs no new engine connection. Their fds come out of PROXY_FD_HEADROOM (and the one
# made ahead: `FrontProxy._engine_socket`).
UPSTREAM_POOL_MAX = 16
# DEMAND falls this long after the last request in flight ended, if no other came meanwhile. A client that sends
# its next request as the last reply ends (a stream after a stream, a new connection each: 1-7 ms later for
# bench.proxy's clients on 2 loaded cores) would otherwise make DEMAND fall and rise again between them, each change
# a line to the supervisor and a round of its pace loop (~0.4 ms of its CPU a request at one stream). The engine
# keeps its window that much longer when it goes idle, below a schedule's period (tens of ms) and the pace loop's
# own accounting step (its rounds, 25 ms apart).
DEMAND_FALL_GRACE_S = 0.005
THREAD_NAME = b"gpushare-proxy"  # the loop thread's name (top -H, /proc/PID/task/TID/comm): PR_SET_NAME
PEERS_PATH = "/gpu/peers"
PROPS_PATH = "/props"
HEALTH_PATH = "/health"
# what llama-server itself answers /health while it loads its model
LOADING_BODY = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
# Heads are parsed by llhttp (httptools: a client's request, the engine's response), which checked their names and
# values as it read them; they are passed on as bytes joined, not checked again (h11's checks cost more than half of
# a request's time in the proxy). hop-by-hop (RFC 9110 §7.6.1): never passed on; each hop's own framing and
# Connection are written for it
HOP_HEADERS = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"upgrade"})
FD_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# chunk-size [ chunk-ext ] CRLF (RFC 9112 §7.1; the size as h11 reads it: at most 20 hex digits)
HEX_DIGITS = b"0123456789abcdefABCDEF"
CHUNK_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,20})[ \t]*(?:;[^\r\n]*)?\r\n")
TRAILER_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\r\n]*?)[ \t]*")


class ProxyError(GpushareError):
    """The proxy could not be set up (its port taken, say); the message says which."""


class _Cut(Exception):
    """A client or the engine broke the exchange (bad framing, a budget spent, a side closed): the
    connection is closed, after `status` (a 4xx/5xx) when no response has begun and one is due."""

    def __init__(self, why: str, status: int | None = None) -> None:
        super().__init__(why)
        self.status = status


class _Unanswered(_Cut):
    """The engine ended a connection it had kept alive before a byte of its reply to the request sent on it:
    it closed the connection as idle while the request crossed (cpp-httplib closes one idle for 5 s, and a
    connection whose reply ended as the engine closed it looks reusable until its FIN is read). The engine
    never read that request, so it is sent again on another connection, as browsers and Go's net/http do."""


class _Sent:
    """A request as framed for the engine (`head`: its head's bytes; `chunked`: its body in the chunked coding,
    else as long as its Content-Length says), the parts kept for a resend; `parts` is None once they pass
    PROXY_RESEND_MAX_BYTES (a body that large is not resent: the error stands)."""

    def __init__(self, head: bytes, chunked: bool) -> None:
        self.parts: list[bytes] | None = [head]
        self.chunked = chunked
        self.bytes = 0
        self.complete = False

    def add(self, ev: Any) -> bytes:
        """A body event (_Body, _End) framed for the engine, kept."""
        if isinstance(ev, _End):
            self.complete = True
            out = b"0\r\n" + _header_lines(ev.trailers) + b"\r\n" if self.chunked else b""
        else:
            out = b"%x\r\n%s\r\n" % (len(ev.data), ev.data) if self.chunked and ev.data else ev.data
            self.bytes += len(ev.data)
        if self.parts is not None:
            if self.bytes > PROXY_RESEND_MAX_BYTES:
                self.parts = None
            else:
                self.parts.append(out)
        return out


def _engine_failed(up: _Upstream, ex: _Exchange, e: BaseException) -> _Cut:
    """A write to the engine failed: resent when the connection was a kept-alive one with no reply yet."""
    if up.reused and ex.first_byte_s is None:
        return _Unanswered(f"engine: {e}", 502)
    return _Cut(f"engine: {e}", 502)


class RequestTiming(NamedTuple):
    """One request through the proxy: monotonic seconds of its head received, the response's first byte
    (None: none came) and its end; its method and path as sent (untrusted text, for display only). (A tuple:
    one is made per request, at a third of a frozen dataclass's cost.)"""

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
    lowered = [n.lower() for n, _v in headers]
    if b"connection" not in lowered:
        return [h for h, k in zip(headers, lowered) if k not in HOP_HEADERS]
    named = {t.strip().lower() for (_n, v), k in zip(headers, lowered) if k == b"connection" for t in v.split(b",")}
    return [h for h, k in zip(headers, lowered) if k not in HOP_HEADERS and k not in named]


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


def _header_lines(headers: Any) -> bytes:
    """`NAME: VALUE CRLF` for each (name, value) pair."""
    return b"".join([b"%s: %s\r\n" % (n, v) for n, v in headers])


def request_head(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    """An HTTP/1.1 request head from parts already checked (llhttp parsed them; a Host we add: ours), Host
    first (RFC 9110 §7.2), as h11 writes one."""
    host = [(n, v) for n, v in headers if n.lower() == b"host"]
    rest = [(n, v) for n, v in headers if n.lower() != b"host"]
    return b"%s %s HTTP/1.1\r\n%s%s\r\n" % (method, target, _header_lines(host), _header_lines(rest))


class ResponseHead:
    """An engine's response head as llhttp (httptools) parsed it: `headers` (raw name, value) as sent, `lowered`
    the same with lower-case names; Transfer-Encoding (only `chunked`, once) and Content-Length (digits, once)
    checked here, as h11 checked them."""

    __slots__ = ("status_code", "reason", "http_version", "headers", "lowered")

    def __init__(self) -> None:
        self.status_code = 0
        self.reason = b""
        self.http_version = b"1.1"
        self.headers: list[tuple[bytes, bytes]] = []
        self.lowered: list[tuple[bytes, bytes]] = []

    # httptools' callbacks
    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        value = value.rstrip(b" \t")  # llhttp keeps a value's trailing whitespace; h11 drops it
        self.headers.append((name, value))
        self.lowered.append((name.lower(), value))


# the end of a head: its empty line (llhttp wants CRLF line ends; a bare LF is its error, said as one)
HEAD_END = re.compile(rb"\r?\n\r?\n")


def parse_response_head(data: bytes | bytearray) -> tuple[ResponseHead, int] | None:
    """The response head at the start of `data` and where it ends; None while it is not whole. _Cut (502) when
    it is malformed (llhttp's verdict, or a transfer coding other than chunked, a Content-Length that is not
    one number), or not whole within MAX_HEAD_BYTES."""
    m = HEAD_END.search(data)
    if (m.end() if m is not None else len(data)) > MAX_HEAD_BYTES:  # (however its reads came: its end in one or not)
        raise _Cut("engine: a response head over the budget", 502)
    if m is None:
        return None
    head = ResponseHead()
    parser = httptools.HttpResponseParser(head)
    try:
        parser.feed_data(bytes(data[: m.end()]))
    except httptools.HttpParserError as e:
        raise _Cut(f"engine: a malformed response head: {e}", 502) from None
    head.status_code = parser.get_status_code()
    head.http_version = parser.get_http_version().encode()
    codings = [v for n, v in head.lowered if n == b"transfer-encoding"]
    if codings and (len(codings) > 1 or codings[0].lower() != b"chunked"):
        raise _Cut("engine: a transfer coding other than chunked", 502)
    lengths = {v for n, v in head.lowered if n == b"content-length"}
    if len(lengths) > 1 or any(not v.isdigit() or len(v) > 20 for v in lengths):
        raise _Cut("engine: a bad Content-Length", 502)
    return head, m.end()


def body_framing(method: bytes, response: ResponseHead) -> tuple[str, int]:
    """How a response's body ends (RFC 9112 §6.3): ("length", n), ("chunked", 0) or ("close", 0) (at the
    engine's EOF)."""
    if response.status_code in (204, 304) or method == b"HEAD":
        return "length", 0
    lengths = None
    for name, value in response.lowered:  # checked: one transfer coding (chunked), one length
        if name == b"transfer-encoding":
            return "chunked", 0
        if name == b"content-length":
            lengths = value
    if lengths is not None:
        return "length", int(lengths)
    return "close", 0


class _Conn(asyncio.Protocol):
    """One socket (a client's or the engine's) on the loop. A coroutine reads it (`read`) and writes it
    (`write`, `drain`); while `sink` is set, each read is handed to it instead, on the loop's callback (b"":
    the peer's EOF or the connection lost). Reading pauses while PROXY_PIPELINE_BUFFER_BYTES wait unread, and
    while `feeder` (the connection whose reads are written here) would overfill this one's write buffer.

    `sock`: an accepted socket, not yet the loop's transport: `read` waits for it to be readable and reads it
    itself (a request whole in what came goes to the engine with no transport made: the loop's part of a
    request's latency); `attach` makes it one (as `drain`, and `read` after a write, do first); what is written
    before is written at the attach."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        self.loop = asyncio.get_running_loop()  # made on the loop's thread, by the loop (a protocol factory)
        self.transport: asyncio.Transport | None = None
        self.sock = sock  # until attached
        self.attaching = False
        self.unsent: list[bytes] = []  # written before the attach
        self.buf = bytearray()
        self.eof = False
        self.lost = False
        self.sink: Callable[[bytes], None] | None = None
        self.on_eof: Callable[[], None] | None = None
        self.on_lost: Callable[[], None] | None = None
        self.feeder: _Conn | None = None
        self.failed: BaseException | None = None  # set by `abort`: the next read raises it
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._read_paused = False
        self.write_paused = False
        self.fd = sock.fileno() if sock is not None else -1

    # -- the protocol (the loop's callbacks) ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        self.fd = sock.fileno() if sock is not None else -1
        if self.unsent:  # before anything written from now
            unsent, self.unsent = self.unsent, []
            t.write(b"".join(unsent))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        sink = self.sink
        if sink is not None:
            sink(data)
            return
        self.buf += data
        if len(self.buf) >= PROXY_PIPELINE_BUFFER_BYTES and not self._read_paused and self.transport is not None:
            self._read_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        if self.sink is not None:
            self.sink(b"")
        if self.on_eof is not None:
            self.on_eof()
        return True  # a half-close: our side stays open for the reply

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = self.lost = True
        self._wake()
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)
        if self.sink is not None:
            self.sink(b"")
        if self.on_lost is not None:
            self.on_lost()

    def pause_writing(self) -> None:
        self.write_paused = True
        feeder = self.feeder
        if feeder is not None and feeder.transport is not None:
            feeder.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)
        feeder = self.feeder
        if feeder is not None and feeder.transport is not None:
            feeder.transport.resume_reading()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- for coroutines -----------------------------------------------------------------------------------

    def read_at_once(self) -> None:
        """What has come on the accepted socket by now (at most PROXY_PIPELINE_BUFFER_BYTES), into `buf`, without
        waiting (b"" or an error: `eof`, and `lost`)."""
        sock = self.sock
        if sock is None or self.attaching or self.eof:
            return
        try:
            data = sock.recv(PROXY_PIPELINE_BUFFER_BYTES, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.eof = self.lost = True
            return
        if data:
            self.buf += data
        else:
            self.eof = True

    async def attach(self) -> None:
        """The accepted socket made the loop's transport (now, unless it is already); ConnectionResetError
        where it cannot be (the peer reset it meanwhile)."""
        sock = self.sock
        if sock is None or self.attaching:
            return
        self.attaching = True  # (what is written meanwhile waits in `unsent` for `connection_made`)
        try:  # (uvloop's TCP transports set TCP_NODELAY: each response head is written at once)
            await self.loop.connect_accepted_socket(lambda: self, sock)
        except OSError as e:
            self.eof = self.lost = True
            self.unsent.clear()
            sock.close()
            raise ConnectionResetError(f"connection lost: {e}") from None
        finally:
            self.sock = None
            self.attaching = False

    def buffered(self) -> int:
        return len(self.buf)

    def abort(self, e: BaseException) -> None:
        """The exchange failed elsewhere (the client left, its body broke): a read waiting raises `e`."""
        self.failed = e
        self._wake()

    def take(self) -> bytes:
        """What has come and not been taken (reading resumes if it paused)."""
        data = bytes(self.buf)
        self.buf.clear()
        if self._read_paused and self.transport is not None:
            self._read_paused = False
            self.transport.resume_reading()
        return data

    async def read(self, timeout_s: float | None = None) -> bytes:
        """What has come since the last read (b"" at EOF); TimeoutError when nothing came within `timeout_s`."""
        if self.sock is not None and self.unsent:  # what was written goes first (then it is the transport's)
            await self.attach()
        sock = self.sock
        if sock is not None and not self.attaching:  # not yet a transport: read here
            if not self.buf and not self.eof and self.failed is None:
                await _readable(self.loop, sock, timeout_s)
                self.read_at_once()
        elif not self.buf and not self.eof and self.failed is None:
            waiter = self._waiter = self.loop.create_future()
            # a timer that fails the wait, not asyncio.timeout: no context object, task lookup or cancel to undo
            timer = self.loop.call_later(timeout_s, _expire, waiter) if timeout_s is not None else None
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        if self.failed is not None:
            raise self.failed
        return self.take()

    def write(self, data: bytes) -> None:
        """ConnectionResetError when the peer is gone."""
        t = self.transport
        if t is None and self.sock is not None and not self.lost:
            if data:
                self.unsent.append(data)
            return
        if self.lost or t is None or t.is_closing():
            raise ConnectionResetError("connection lost")
        if data:
            t.write(data)

    async def drain(self) -> None:
        """Until the write buffer is below its high-water mark; ConnectionResetError when the peer is gone."""
        if self.sock is not None:
            await self.attach()
        if self.write_paused and not self.lost:
            self._drained = self.loop.create_future()
            try:
                await self._drained
            finally:
                self._drained = None
        if self.lost:
            raise ConnectionResetError("connection lost")

    def close(self) -> None:
        """Closed once what was written is sent (`drain` first where it was written before an attach)."""
        if self.transport is not None:
            self.transport.close()
        elif self.sock is not None:
            self.sock.close()
            self.sock = None


class _Head:
    """A client's request head as llhttp read it: `headers` (raw name, value) as sent."""

    __slots__ = ("method", "target", "http_version", "headers", "keep_alive")

    def __init__(self, method: bytes, target: bytes, http_version: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.method = method
        self.target = target
        self.http_version = http_version
        self.headers = headers
        # HTTP/1.0 never (as h11 serves it), HTTP/1.1 unless the client says close
        self.keep_alive = http_version == b"1.1" and not any(
            n.lower() == b"connection" and b"close" in v.lower() for n, v in headers
        )


class _Body:
    """A piece of a request's body (its chunked coding, if any, taken off)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _End:
    """A request's end, with its trailers (a chunked body's)."""

    __slots__ = ("trailers",)

    def __init__(self, trailers: list[tuple[bytes, bytes]]) -> None:
        self.trailers = trailers


NEED_DATA = "need data"  # _client_poll: nothing whole yet
CLOSED = "closed"  # _client_poll: the client ended between requests


class _RequestReader:
    """A client connection's bytes as llhttp (httptools) reads them: `events`, in order, are each request's
    _Head, its _Body pieces and its _End. A head over MAX_HEAD_BYTES is _Cut 431, malformed framing 400 (when the
    events before it are taken: pipelined requests before it are answered first). After a request that ends the
    connection (not keep-alive), nothing more is read. An `Upgrade` request is read as a plain one (it is answered
    as one: Upgrade is hop-by-hop); what follows it is the next request."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.events: deque[Any] = deque()
        self.body_bytes = 0  # of the _Body events queued
        self.in_message = False  # a request begun and not ended
        self.in_head = False  # its head begun and not whole
        self.head_bytes = 0  # bytes read while a head was not whole
        self.trailer_bytes = 0  # of the request's trailers so far
        self.last = False  # a request that ends the connection was read: nothing after it is
        self.error: _Cut | None = None  # raised once the events before it are taken
        self._url = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._head: _Head | None = None

    def pending(self) -> int:
        """Bytes read and not yet taken (a request begun counts one)."""
        return self.body_bytes + (1 if self.in_message or self.events else 0)

    def feed(self, data: bytes) -> None:
        if self.last or self.error is not None or not data:
            return
        if self.in_head or not self.in_message:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as e:  # after an Upgrade request (or CONNECT): read what follows anew
            self.parser = httptools.HttpRequestParser(self)
            self.in_message = self.in_head = False
            self.head_bytes = 0
            self.feed(data[e.args[0] :])
            return
        except httptools.HttpParserCallbackError as e:  # one of ours, raised in a callback
            cut = e.__context__
            self.error = cut if isinstance(cut, _Cut) else _Cut(f"bad request: {e}", 400)
        except httptools.HttpParserError as e:
            if not self.last:  # bytes after a request that closes the connection are not read
                self.error = _Cut(f"bad request: {e}", 400)
        if self.in_head and self.head_bytes > MAX_HEAD_BYTES and self.error is None:
            self.error = _Cut("request head too large", 431)

    # -- httptools' callbacks
    def on_message_begin(self) -> None:
        self.in_message = self.in_head = True
        self.trailer_bytes = 0
        self._url = b""
        self._fields = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields.append((name, value.rstrip(b" \t")))  # a head's or, after it, the trailers'
        if not self.in_head:  # trailers: within the head's budget (a head's own bytes are counted as they come)
            self.trailer_bytes += len(name) + len(value) + 4
            if self.trailer_bytes > MAX_HEAD_BYTES:
                raise _Cut("request trailers too large", 431)

    def on_headers_complete(self) -> None:
        version = self.parser.get_http_version().encode()
        head = _Head(self.parser.get_method(), self._url, version, self._fields)
        if sum(len(n) + len(v) + 4 for n, v in self._fields) + len(self._url) > MAX_HEAD_BYTES:
            raise _Cut("request head too large", 431)
        if version == b"1.1" and sum(n.lower() == b"host" for n, _v in self._fields) != 1:
            raise _Cut("an HTTP/1.1 request needs one Host header", 400)  # as h11 (RFC 9112 §3.2)
        codings = [v.lower() for n, v in self._fields if n.lower() == b"transfer-encoding"]
        if codings and codings != [b"chunked"]:  # llhttp takes any coding list ending in chunked: h11 took none
            raise _Cut("only Transfer-Encoding: chunked is supported", 501)
        if self.parser.should_upgrade() and any(
            n.lower() in (b"content-length", b"transfer-encoding") for n, _v in self._fields
        ):  # llhttp reads no body after an Upgrade request: one would be taken for the next request
            raise _Cut("a request body with Upgrade", 400)
        self._head = head
        self.events.append(head)
        self.in_head = False
        self.head_bytes = 0
        self._fields = []

    def on_body(self, data: bytes) -> None:
        self.events.append(_Body(data))
        self.body_bytes += len(data)

    def on_message_complete(self) -> None:
        self.events.append(_End(self._fields))
        self._fields = []
        self.in_message = False
        if self._head is not None and not self._head.keep_alive:
            self.last = True


class _Client:
    """One accepted connection: its requests (`reader`), the response being written (`req` the request it
    answers), its engine connection (opened at its first request) and since when it has had no request in flight
    (None while one is: not evictable). Responses are written as h11 writes them (RFC 9112 §6): a body of
    unknown length chunked to an HTTP/1.1 client, delimited by closing to HTTP/1.0; `Connection: close` when the
    connection ends after it."""

    def __init__(self, conn: _Conn, now_s: float) -> None:
        self.reader = _RequestReader()
        self.conn = conn
        self.evictable_since: float | None = now_s
        self.up: _Upstream | None = None
        self.task: asyncio.Task | None = None
        self.served = 0
        self.req: _Head | None = None
        self.request_ended = False  # the request's _End was taken
        self.responded = False  # its response's head was written
        self.response_ended = False
        self.keep_alive = False  # the connection may carry another request after this response
        self.out_framing = "length"  # the response body as written: "length" (as it comes), "chunked", "none"

    def buffered(self) -> int:
        """Bytes received and not yet taken by a request: the reader's and the connection's."""
        return self.reader.pending() + self.conn.buffered()

    def pull(self, data: bytes) -> None:
        """`data` to the reader, after what the connection holds."""
        if self.conn.buf:
            self.reader.feed(self.conn.take())
        self.reader.feed(data)

    def begin(self, req: _Head) -> None:
        self.req = req
        self.request_ended = self.responded = self.response_ended = False

    def reusable(self) -> bool:
        return self.keep_alive and self.request_ended and self.response_ended

    def response_head(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
        """The final response's head (`headers` hop-by-hop free), its framing for this client chosen as h11's."""
        req = self.req
        method = req.method if req is not None else b"GET"
        http_10 = req is None or req.http_version != b"1.1"
        te = cl_ = False
        for n, _v in headers:
            k = n.lower()
            te = te or k == b"transfer-encoding"
            cl_ = cl_ or k == b"content-length"
        no_body = status in (204, 304) or 100 <= status < 200
        close = req is None or not req.keep_alive
        if not no_body and (te or not cl_):  # a body of unknown length
            headers = [(n, v) for n, v in headers if n.lower() not in (b"content-length", b"transfer-encoding")]
            if http_10:  # no chunked coding: delimited by closing
                close = close or method != b"HEAD"
                self.out_framing = "length"
            else:
                headers.append((b"Transfer-Encoding", b"chunked"))
                self.out_framing = "chunked"
        else:
            self.out_framing = "length"
        if method == b"HEAD" or no_body:
            self.out_framing = "none"
        if close:
            headers = [*headers, (b"Connection", b"close")]
        self.keep_alive = not close
        self.responded = True
        return b"HTTP/1.1 %d %s\r\n%s\r\n" % (status, reason, _header_lines(headers))

    def head_written_chunked(self) -> None:
        """A final response head with a chunked body was written for this client's request (by the C relay, as
        `response_head` writes one for an HTTP/1.1 client: `Connection: close` where the request asked)."""
        req = self.req
        self.keep_alive = req is not None and req.keep_alive
        self.out_framing = "chunked"
        self.responded = True

    def body(self, data: bytes) -> bytes:
        """A piece of the response body as written to this client."""
        if self.out_framing == "chunked":
            return b"%x\r\n%s\r\n" % (len(data), data) if data else b""
        return b"" if self.out_framing == "none" else data

    def end(self, trailers: list[tuple[bytes, bytes]]) -> bytes:
        """The response's end (its last chunk and trailers when chunked)."""
        self.response_ended = True
        if self.out_framing == "chunked":
            return b"0\r\n%s\r\n" % _header_lines(trailers)
        return b""


def informational(status: int, reason: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    """A 1xx response's head."""
    return b"HTTP/1.1 %d %s\r\n%s\r\n" % (status, reason, _header_lines(headers))


class _Upstream:
    """A connection to the engine, reused while both sides keep it alive. Each request is written as `_Sent`
    frames it, its response's head parsed by llhttp (`parse_response_head`), its body relayed by `_Relay`."""

    def __init__(self, conn: _Conn, now_s: float) -> None:
        self.conn = conn
        self.idle_since_s = now_s
        self.half_closed = False
        self.reused = False  # it carried an exchange before this one: the engine may be closing it (_Unanswered)
        self.clean = True  # the last exchange ended at its reply's end, nothing after it, keep-alive both ways

    def reusable(self, now_s: float) -> bool:
        c = self.conn
        return (
            self.clean
            and not self.half_closed
            and not c.eof
            and not c.buf
            and now_s - self.idle_since_s < UPSTREAM_REUSE_IDLE_S
        )

    def close(self) -> None:
        self.conn.close()


class _Relay:
    """An engine's response body relayed to the client as its reads come: `feed` is the engine connection's
    sink (b"": its EOF), called on the loop's callback. `raw`: a chunked body passes unchanged but for its last
    chunk and trailers (`trailers`: written at the end, `_Client.end`); else each piece of the payload is framed
    for the client (`_Client.body`) after `head`, or goes into `held` (a /props reply; `release` sends it as it
    came). `done` resolves at the body's end, or fails with _Cut or ConnectionResetError. `extra`: bytes came after
    the body. `offload`: where set (with `up`, the engine's connection), a stream relayed raw goes to the C relay
    (FrontProxy._offload) at its first chunk boundary (its head written); it comes back (`taken_back`) at its end
    (`last_written`: the C relay wrote its last chunk), at anything the C relay leaves to this scan, or at the
    engine's EOF; `unload` takes it back at once."""

    __slots__ = ("cl", "transport", "head", "framing", "left", "crlf", "line", "in_trailers", "trailer_bytes",
                 "raw", "held", "held_bytes", "trailers", "done", "extra", "ended", "last_written",
                 "rec", "rec_req", "clock", "quick", "up", "offload", "owner", "token",
                 "engine_sock", "on_head")  # fmt: skip

    def __init__(
        self, cl: _Client, head: ResponseHead, framing: str, length: int, raw: bool, held: list[bytes] | None
    ) -> None:
        self.cl = cl
        self.transport = cl.conn.transport
        self.head = head
        self.framing = framing
        self.left = length  # "length": bytes of the body to come; "chunked": of the current chunk's data
        self.crlf = 0  # "chunked": bytes of the CRLF after a chunk's data still to come
        self.line = bytearray()  # "chunked": a size line or trailer begun in an earlier read
        self.in_trailers = False
        self.trailer_bytes = 0
        self.raw = raw
        self.held = held
        self.held_bytes = 0
        self.trailers: list[tuple[bytes, bytes]] = []
        # None at the body's end; a C relay's report where the loop must adopt the engine's socket (`taken_back`)
        self.done: asyncio.Future[_relay.Report | None] = cl.conn.loop.create_future()
        self.extra = False
        self.ended = False
        self.last_written = False
        self.rec: LatencyRecorder | None = None  # set with `rec_req` when the request is timed
        self.rec_req: Request | None = None
        self.clock: Callable[[], float] = time.monotonic
        # a chunked stream relayed raw, at a chunk boundary: the next read is tried as one whole chunk (`feed`)
        self.quick = raw and framing == "chunked"
        self.up: _Conn | None = None
        self.offload: Callable[[_Relay], bool] | None = None
        self.owner: FrontProxy | None = None  # while the C relay has the stream: its proxy, and the stream's token
        self.token: int | None = None
        # a request the C relay made (FrontProxy._request_in_c): the engine's socket, until the loop adopts it or
        # the exchange ends; `on_head` is told what the report says of the reply's head
        self.engine_sock: socket.socket | None = None
        self.on_head: Callable[[tuple[float, int, float, int, int]], None] | None = None

    def feed(self, data: bytes) -> None:
        if self.quick:  # a stream's usual read, one token's chunk `SIZE CRLF DATA CRLF`, in as few steps as it takes
            n = len(data)
            nl = data.find(b"\r\n", 0, 22)
            if 0 < nl < n - 4 and data[n - 2 :] == b"\r\n" and data[:nl] == b"%x" % (n - nl - 4):
                t = self.transport
                if t is not None and not t.is_closing():
                    try:
                        r = self.rec_req
                        if r is not None:  # one clock read per read relayed: the per-token cost
                            self.rec.chunk(r, self.clock(), data, nl + 2)  # type: ignore[union-attr]
                        t.write(data)
                        if self.offload is not None:
                            self.offload(self)
                    except Exception as e:  # as in `_feed`: the exchange ends with it, never the loop's callback
                        self.fail(e)
                    return
            self.quick = False  # anything else (a size with zeros or upper case, a part, several): scanned
        self._feed(data)
        self.quick = self.raw and not (self.ended or self.left or self.crlf or self.line or self.in_trailers)

    def _feed(self, data: bytes) -> None:
        if self.ended:
            self.extra = self.extra or bool(data)
            return
        if data and self.rec_req is not None:  # one clock read per read relayed: the per-token cost
            self._timed(data)
        try:
            if not data:
                if self.framing != "close":
                    raise _Cut("engine closed before its reply ended", 502)
                self.end()
            elif self.framing == "chunked":
                self._chunked(data)
            elif self.framing == "close":
                self._payload(data)
            elif len(data) < self.left:
                self.left -= len(data)
                self._payload(data)
            else:
                n, self.left = self.left, 0
                self._payload(data[:n] if len(data) > n else data)
                self.extra = len(data) > n
                self.end()
        except Exception as e:  # _Cut, the client gone, a bug: the exchange ends with it
            self.fail(e)

    def _timed(self, data: bytes) -> None:
        """Tell the recorder of a read, before it is relayed (`_chunked` changes the state read here): a read
        of a chunked body that begins a chunk (a stream's usual read: `SIZE CRLF event CRLF`) is looked at from
        the event on, so an SSE ping or `[DONE]` is known as no token; the last chunk (size 0) is no chunk."""
        if self.in_trailers:
            return  # the last chunk's rest (its trailers, its CRLF): no token
        at = 0
        if self.framing == "chunked" and not (self.left or self.crlf or self.line):
            if data.startswith(b"0\r\n"):
                return
            nl = data.find(b"\r\n", 0, 22)
            at = nl + 2 if nl > 0 else 0
        assert self.rec is not None and self.rec_req is not None
        self.rec.chunk(self.rec_req, self.clock(), data, at)

    def unload(self) -> None:
        """The C relay lets go of the stream now, if it has it: once this returns it touches neither socket."""
        if self.token is not None and self.owner is not None:
            self.owner._unload(self)

    def taken_back(self, report: _relay.Report) -> None:
        """A report of the C relay on this stream (`Relayer.collect`, `cancel`): the reads it held for the first
        token, the arrival times of its tokens; where it ended there, the scan goes on here from where it stopped,
        with what it left unrelayed (or the exchange fails: the client left). A request the C relay made: what
        came of the reply's head first; `done` resolves with the report where the loop must adopt the engine's
        socket to go on (its head not plain, or its body's framing the loop's to scan)."""
        token, reason, err, *_, times, _dropped, _relayed, held, head = report
        if head is not None and self.on_head is not None:
            self.on_head(head)
        rec, r = self.rec, self.rec_req
        if rec is not None and r is not None:
            if held and not self._look(rec, r, token, held):
                times = ()  # the reads they were taken of were told as reads
            if r.last_s is not None and times:
                rec.tokens(r, times)
        if reason == _relay.LIVE:
            return
        self.token = self.owner = None
        self.offload = None  # what it left here (a form of framing it does not relay) stays here
        if reason == _relay.CANCELLED:
            return
        if reason == _relay.CLIENT_GONE:
            self.fail(ConnectionResetError("the client left"))
            return
        if self.engine_sock is not None:  # a request it made
            if reason == _relay.CONNECT_FAILED:
                self.fail(_Cut(f"engine unreachable: {os.strerror(err)}", 502))
                return
            if head is None or not head[4]:  # no head written to the client
                if reason == _relay.HEAD:
                    self.done.set_result(report)
                elif reason == _relay.EOF:
                    self.fail(_Cut("engine closed before its reply", 502))
                else:
                    self.fail(_Cut(f"engine: {os.strerror(err)}", 502))
                return
            if reason in (_relay.ODD, _relay.LAST):
                self.done.set_result(report)
                return
        self.resume(report)

    def resume(self, report: _relay.Report) -> None:
        """Where the C relay stopped (`taken_back`), the body goes on here."""
        _token, reason, _err, state, left, out, rest, *_ = report
        up_eof = reason in (_relay.EOF, _relay.READ_ERROR)
        try:
            up = self.up
            if not up_eof and up is not None and up.transport is not None:
                up.transport.resume_reading()  # before the write: a full client buffer pauses it again
            if out:
                self._out(out)
        except Exception as e:
            self.fail(e)
            return
        if reason == _relay.DONE:  # the last chunk, without trailers, was written there: the body ended
            self.last_written = True
            self.end()
            if rest:
                self.feed(rest)  # bytes after the body (`extra`)
            return
        if state == _relay.IN_DATA:
            self.left = left
        elif state == _relay.IN_CRLF:
            self.crlf = left
        self.quick = self.raw and not (self.left or self.crlf)
        if rest:
            self.feed(rest)
        if up_eof:
            self.feed(b"")

    def _look(self, rec: LatencyRecorder, r: Request, token: int, held: tuple[_relay.Held, ...]) -> bool:
        """The reads the C relay relayed and held until the first token is known, told to the recorder as this
        scan tells its own (`_timed`), and the C relay told whether it was found (`Relayer.seen`, which gives the
        reads held since); whether the report's read times are still the tokens (False: the reads they were
        taken of were given and told here instead)."""
        relayer = self.owner._relayer if self.owner is not None else None
        rec.reads(r, held)
        if relayer is None:
            return True
        first = found = r.last_s is not None
        while True:  # not found: the reads held since are given, until the first token is in them or none are
            more = relayer.seen(token, found)
            rec.reads(r, more)
            if found or not more:
                return first
            found = r.last_s is not None

    def fail(self, e: BaseException) -> None:
        self.unload()
        if not self.ended:
            self.ended = True
            self.quick = False
            if not self.done.done():
                self.done.set_exception(e)

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.quick = False
            if not self.done.done():
                self.done.set_result(None)

    def _out(self, data: bytes) -> None:
        t = self.transport
        if t is None:  # the client's socket not yet the loop's (a request the C relay made): written at its attach
            self.cl.conn.write(data)
            return
        if t.is_closing():
            raise ConnectionResetError("the client left")
        t.write(data)

    def release(self) -> None:
        """A held reply as it came (the rest of it relayed as it comes)."""
        held, self.held = self.held, None
        head = self.head
        self._out(self.cl.response_head(head.status_code, head.reason, hop_filtered(head.headers)))
        for part in held or ():
            self._payload(part)

    def _payload(self, data: bytes) -> None:
        held = self.held
        if held is None:
            self._out(self.cl.body(data))
            return
        held.append(data)
        self.held_bytes += len(data)
        if self.held_bytes > PROXY_PROPS_MAX_BYTES:  # too large to parse
            self.release()

    def _chunked(self, data: bytes) -> None:
        """Scan `data` for the chunked coding's size lines; raw: write what is scanned, but for a size line not
        yet whole and the last chunk on."""
        pos, end = 0, len(data)
        if self.raw and not (self.left or self.crlf or self.line or self.in_trailers):
            pos = _whole_chunks(data)  # a stream's read: one token's chunk, or a few
            if pos == end:
                self._out(data)
                return
        raw_from = 0
        line = self.line
        mark = pos  # where the element being scanned began: on a fault, what came before it is relayed
        try:
            while pos < end:
                mark = pos
                if self.left:
                    take = min(self.left, end - pos)
                    if not self.raw:
                        self._payload(data[pos : pos + take])
                    pos += take
                    self.left -= take
                    if not self.left:
                        self.crlf = 2
                    continue
                if self.crlf:
                    want = b"\r\n"[2 - self.crlf :]
                    got = data[pos : pos + len(want)]
                    if not want.startswith(got):
                        raise _Cut("engine: no CRLF after a chunk's data", 502)
                    pos += len(got)
                    self.crlf -= len(got)
                    continue
                nl = data.find(b"\n", pos)
                if nl < 0:
                    if len(line) + end - pos > MAX_HEAD_BYTES:
                        raise _Cut("engine: a chunk-size line over the budget", 502)
                    if self.raw and not self.in_trailers and pos > raw_from:
                        self._out(data[raw_from:pos])  # what came before the size line begun
                    line += data[pos:]
                    return
                whole = data[pos : nl + 1]
                if line:
                    whole = bytes(line) + whole
                    line.clear()
                pos = nl + 1
                if self.in_trailers:
                    self.trailer_bytes += len(whole)
                    if self.trailer_bytes > MAX_HEAD_BYTES:
                        raise _Cut("engine: trailers over the budget", 502)
                    if whole in (b"\r\n", b"\n"):
                        self.extra = pos < end
                        self.end()
                        return
                    m = TRAILER_LINE.fullmatch(whole.rstrip(b"\r\n"))
                    if m is None:
                        raise _Cut("engine: a malformed trailer", 502)
                    self.trailers.append((m[1], m[2]))
                    continue
                m = CHUNK_SIZE_LINE.fullmatch(whole)
                if m is None:
                    raise _Cut("engine: a malformed chunk-size line", 502)
                size = int(m[1], 16)
                start = pos - len(whole)  # where the line began in `data` (< 0: in an earlier read, held back then)
                if size == 0:  # the last chunk: it and the trailers are written at the end (_Client.end)
                    if self.raw and start > raw_from:
                        self._out(data[raw_from:start])
                    self.in_trailers = True
                    raw_from = pos
                    continue
                if start < 0:
                    if self.raw:
                        self._out(whole)
                    raw_from = pos
                self.left = size
        except _Cut:
            if self.raw and not self.in_trailers and mark > raw_from:
                self._out(data[raw_from:mark])
            raise
        if self.raw and not self.in_trailers and raw_from < end:
            self._out(data if raw_from == 0 else data[raw_from:])


class FrontProxy:
    """A reverse proxy from `listen` (host, port; port 0: any free one, see `port`) to `upstream`, counting
    requests in flight (`in_flight`) and calling `on_demand` at 0 -> 1 and 1 -> 0. Thread-safe to read.

    `sock`: a listening TCP socket to serve instead of binding `listen` (handed down: it is not closed by
    `close`, only our copy). `engine_ready`: False when the engine is still loading (`set_engine_ready`).
    `seed_view`: the engine's GPU entry (`{gpu_key, period_ms, self, peers, ...}`), called on a worker
    thread at most once per PROXY_SEED_VIEW_MAX_AGE_S; None: /gpu/peers and /props go to the engine as is.
    `idle_keepalive_s`, `body_idle_s`, `max_connections`, `engine_wait_s`: the budgets (tests make them
    small). `on_error`: told one line the first time each kind of unexpected exception (a bug) ends a
    connection or an accept. `c_relay`: streams are relayed by the C relay (core/engines/_relay.c) where it was
    built; False: every byte on the loop (tests compare the two)."""

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
        sock: socket.socket | None = None,
        engine_ready: bool = True,
        engine_wait_s: float = PROXY_ENGINE_WAIT_S,
        c_relay: bool = True,
    ) -> None:
        self.listen = listen
        # the C relay times tokens by CLOCK_MONOTONIC: with another clock (tests) every stream stays on the loop
        self.c_relay = c_relay and _relay is not None and clock_s is time.monotonic
        self._relayer: Any = None  # _relay.Relayer, on the loop's thread while it serves
        self._relay_fd = -1
        self._relayed: dict[int, _Relay] = {}  # the streams the C relay has, by token
        self.relayed_in_c_total = 0  # streams it relayed (handed to it, or their head written there)
        self.requests_in_c_total = 0  # requests it made on a new engine connection (`_request_in_c`)
        self._engine_addr = _numeric_address(upstream)  # (family, sockaddr); None: a name (the loop connects)
        self._on_error = on_error
        self.errors_total = 0  # unexpected exceptions (a bug): each connection's ends it alone, never the proxy
        self._errors_said: set[str] = set()
        self.upstream = upstream
        self._on_demand = on_demand
        self._clock = clock_s
        self._seed_view = seed_view
        self.idle_keepalive_s = idle_keepalive_s
        self.body_idle_s = body_idle_s
        self.engine_wait_s = engine_wait_s
        self.max_connections = connection_cap(max_connections)
        self.in_flight = 0
        self._demand_fall: asyncio.TimerHandle | None = None  # DEMAND's fall, told after DEMAND_FALL_GRACE_S
        self.requests_total = 0
        self.evicted_total = 0  # connections closed at the cap to make room for a newcomer
        self.timings: deque[RequestTiming] = deque(maxlen=TIMINGS_KEPT)
        # latency as clients see it (work requests only): written on the loop's thread, read on any (`report`)
        self.latency = LatencyRecorder(clock_s=clock_s)
        self.demand_changes: deque[tuple[float, bool]] = deque(maxlen=TIMINGS_KEPT)  # (monotonic s, demand)
        self._clients: set[_Client] = set()
        self._pool: list[_Upstream] = []  # idle engine connections, the most recently used last
        self._spare: socket.socket | None = None  # an engine connection made ahead (`_engine_socket`)
        self._spare_timer: asyncio.TimerHandle | None = None
        self._open = 0  # accepted and not ended (a connection counts from its accept, before it is a _Client)
        self._room: asyncio.Event | None = None
        self._seed_cache: tuple[float, dict] | None = None
        self._seed_pending: asyncio.Future | None = None
        self._sock: socket.socket | None = sock
        self._engine_ready_at_start = engine_ready
        self._engine_ready: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self._closing = False
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
        """Bind now (ProxyError if it cannot; a socket handed down is served as it is), then serve on a thread
        of its own."""
        if self._sock is None:
            self._sock = listen_socket(self.listen)
        self._sock.setblocking(False)
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="gpushare-front-proxy", daemon=True)
        self._thread.start()
        ready.wait(5)
        return self

    def set_engine_ready(self) -> None:
        """The engine takes requests now (thread-safe): those waiting go to it."""
        self._engine_ready_at_start = True
        loop, event = self._loop, self._engine_ready
        if loop is not None and event is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop closed meanwhile
                pass

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
        _name_thread(THREAD_NAME)
        loop = uvloop.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve(ready))
        finally:
            loop.close()

    async def _serve(self, ready: threading.Event) -> None:
        self._stopped = asyncio.Event()
        self._room = asyncio.Event()
        self._engine_ready = asyncio.Event()
        if self._engine_ready_at_start:
            self._engine_ready.set()
        if self.c_relay:
            self._start_relayer()
        accept = asyncio.create_task(self._accept_loop())
        ready.set()
        try:
            await self._stopped.wait()
        finally:
            self._closing = True
            accept.cancel()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for up in self._pool:
                up.close()
            self._drop_spare()
            self._stop_relayer()
            if self._demand_fall is not None:  # told now: nothing is in flight any more
                self._demand_fall.cancel()
                self._demand_fell()

    def _start_relayer(self) -> None:
        """The C relay's thread, and the eventfd on which it says it has reports (an error: streams stay here)."""
        try:
            fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except OSError:
            return
        try:
            self._relayer = _relay.Relayer(
                fd,
                NOT_TOKENS,
                PROXY_RELAY_OUT_MAX_BYTES,
                PROXY_RELAY_TIMES_FLUSH_S,
                STREAM_CONTENT_TYPES,
                MAX_HEAD_BYTES,
                sorted(HOP_HEADERS),
            )
        except (OSError, RuntimeError, ValueError):
            os.close(fd)
            return
        self._relay_fd = fd
        asyncio.get_running_loop().add_reader(fd, self._relay_reports)

    def _stop_relayer(self) -> None:
        for relay in list(self._relayed.values()):
            relay.unload()
        relayer, fd = self._relayer, self._relay_fd
        self._relayer, self._relay_fd = None, -1
        if relayer is not None:
            asyncio.get_running_loop().remove_reader(fd)
            relayer.close()
            os.close(fd)

    def _offload(self, relay: _Relay) -> bool:
        """Hand a stream at a chunk boundary to the C relay: False when it stays on the loop (the client has not
        taken all that was written to it: tried again at the next read)."""
        relayer, up, t = self._relayer, relay.up, relay.transport
        if relayer is None or up is None or up.transport is None or t is None or up.fd < 0 or relay.cl.conn.fd < 0:
            relay.offload = None
            return False
        if t.is_closing() or up.transport.is_closing() or t.get_write_buffer_size():
            return False  # (a closing transport's fd may be closed, its number another socket's, any moment)
        r = relay.rec_req
        # its reads kept for the recorder while it may find the first token in them (none in a reply not 2xx)
        hold = PROXY_RELAY_HOLD_MAX_BYTES if r is not None and r.ok and r.last_s is None else -1
        up.transport.pause_reading()
        try:
            token = relayer.start(up.fd, relay.cl.conn.fd, r is not None and r.streamed, hold)
        except (OSError, RuntimeError):  # out of fds or memory: this stream stays here
            up.transport.resume_reading()
            relay.offload = None
            return False
        relay.token, relay.owner, relay.quick = token, self, False
        self._relayed[token] = relay
        self.relayed_in_c_total += 1
        return True

    def _unload(self, relay: _Relay) -> None:
        token = relay.token
        assert token is not None
        self._relayed.pop(token, None)
        report = self._relayer.cancel(token) if self._relayer is not None else None
        if report is not None:
            relay.taken_back(report)
        else:
            relay.token = relay.owner = None

    def _relay_reports(self) -> None:
        """The eventfd: the C relay has reports (streams that ended there, token times)."""
        try:
            os.eventfd_read(self._relay_fd)
        except BlockingIOError:
            pass
        if self._relayer is None:
            return
        for report in self._relayer.collect():
            relay = self._relayed.get(report[0])
            if relay is None:
                if report[10]:  # (no exchange to tell: what it keeps for one goes)
                    self._relayer.seen(report[0], True)
                continue
            if report[1] != _relay.LIVE:
                del self._relayed[report[0]]
            try:
                relay.taken_back(report)
            except Exception as e:  # a bug: that exchange ends with it, the relay goes on
                self._unexpected("relay", e)
                relay.fail(e)

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
            backoff_s = await self._accept_while_room(loop, sock)
            if backoff_s:
                await asyncio.sleep(backoff_s)

    async def _accept_while_room(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> float:
        """Accept each newcomer as the listening socket turns readable (one reader for as long as there is room:
        no wait object or epoll change per accept), until the cap is reached (0 returned) or accept() fails for
        want of fds, or by a bug (the backoff returned: the port is not polled meanwhile)."""
        stop: asyncio.Future[float] = loop.create_future()

        def ready() -> None:
            for _ in range(PROXY_ACCEPTS_PER_WAKE):  # (more at the next readiness: others served between)
                if self._open >= self.max_connections or stop.done():
                    break
                try:
                    conn, _addr = sock.accept()
                except BlockingIOError:
                    return
                except OSError as e:  # out of fds after all (another thread's), an aborted handshake
                    if e.errno in FD_ERRNOS:
                        stop.set_result(PROXY_ACCEPT_BACKOFF_S)
                    return  # (else the next readiness: never a spin inside this callback)
                except Exception as e:  # a bug: said, and the port keeps accepting
                    self._unexpected("accept", e)
                    stop.set_result(PROXY_ACCEPT_BACKOFF_S)
                    return
                self._open += 1
                cl = _Client(_Conn(conn), self._clock())
                try:
                    cl.task = _start_eagerly(self._client(cl))
                except Exception as e:  # a bug (its connection's step ended it): said, and the port keeps accepting
                    self._unexpected("a connection", e)
            else:
                return
            if not stop.done():
                stop.set_result(0.0)

        loop.add_reader(sock.fileno(), ready)
        try:
            return await stop
        finally:
            loop.remove_reader(sock.fileno())

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
        if before == 0 and self.in_flight > 0:
            fall, self._demand_fall = self._demand_fall, None
            if fall is not None:  # the last one ended within the grace: DEMAND never fell
                fall.cancel()
            else:
                self._tell_demand(True)
        elif before > 0 and self.in_flight == 0:
            if self._closing or self._loop is None:
                self._tell_demand(False)
            else:
                self._demand_fall = self._loop.call_later(DEMAND_FALL_GRACE_S, self._demand_fell)

    def _demand_fell(self) -> None:
        self._demand_fall = None
        self._tell_demand(False)

    def _tell_demand(self, demand: bool) -> None:
        self.demand_changes.append((self._clock(), demand))
        if self._on_demand is not None:
            try:
                self._on_demand(demand)
            except Exception:  # a callback's failure must not take the proxy down
                pass

    async def _client(self, cl: _Client) -> None:
        """A connection, started in the accept's callback (`_start_eagerly`): a request whole in its first bytes
        goes to the engine before the loop makes its socket a transport (`_Conn.attach`). Until its first
        suspension there is no current task: nothing before it may need one."""
        try:
            await self._serve_client(cl)
        finally:
            self._open -= 1
            if self._room is not None:
                self._room.set()

    async def _serve_client(self, cl: _Client) -> None:
        conn = cl.conn
        conn.read_at_once()
        self._clients.add(cl)
        try:
            while True:
                req = await self._next_request(cl)
                if req is None:
                    return
                cl.evictable_since = None
                cl.begin(req)
                if not await self._exchange(cl, req):
                    return
                cl.served += 1
                if not cl.reusable():
                    return
                cl.responded = False  # (a next head that breaks the rules is answered its 4xx)
                cl.evictable_since = self._clock()
                if self._room is not None:  # a newcomer waiting at the cap may now take its place
                    self._room.set()
        except _Cut as e:
            if e.status is not None and not cl.responded:
                _answer(cl, e.status, {"error": str(e)}, close=True)
        except OSError:
            pass
        except asyncio.CancelledError:  # close() or an eviction: end quietly
            pass
        except Exception as e:  # a bug: this connection ends, the proxy serves on
            self._unexpected("a connection", e)
        finally:
            self._clients.discard(cl)
            self._release(cl.up)
            if conn.unsent:  # an answer written before the socket was the loop's: sent before the close
                try:
                    await conn.drain()
                except (OSError, asyncio.CancelledError):
                    pass
            conn.close()

    def _release(self, up: _Upstream | None) -> None:
        """A client's engine connection, as it leaves: kept for the next client when it may carry another
        request, else closed."""
        if up is None:
            return
        if up.reusable(self._clock()) and len(self._pool) < UPSTREAM_POOL_MAX and not self._closing:
            self._pool.append(up)
        else:
            up.close()

    async def _next_request(self, cl: _Client) -> _Head | None:
        """The next request head: a new connection's within PROXY_HEAD_DEADLINE_S of its accept, a kept-alive
        one's first byte within the idle budget and the rest within PROXY_HEAD_DEADLINE_S of it. None when the
        client ends (or idles out) between requests; a head begun and not finished in time gets 408."""
        started = self._clock()
        head_until: float | None = None if cl.served else started + PROXY_HEAD_DEADLINE_S
        wait_until = started + self.idle_keepalive_s
        while True:
            ev = _client_poll(cl)
            if isinstance(ev, _Head):
                return ev
            if ev is CLOSED:
                return None
            if ev is not NEED_DATA:  # what a request left unread (its body when it was answered early)
                raise _Cut(f"unexpected {type(ev).__name__}")
            now = self._clock()
            if head_until is None and cl.buffered():  # a pipelined head begun
                head_until = now + PROXY_HEAD_DEADLINE_S
            left = (head_until if head_until is not None else wait_until) - now
            try:
                if left <= 0:
                    raise TimeoutError
                data = await cl.conn.read(left)
            except TimeoutError:
                if cl.buffered():
                    raise _Cut("no complete request head within the deadline", 408) from None
                return None  # idle: closed quietly
            if data and head_until is None:
                head_until = self._clock() + PROXY_HEAD_DEADLINE_S
            cl.pull(data)

    async def _client_event(self, cl: _Client) -> Any:
        """The client's next body event (Data, EndOfMessage): each read within the body-idle budget."""
        while True:
            ev = _client_poll(cl)
            if ev is not NEED_DATA:
                return ev
            try:
                data = await cl.conn.read(self.body_idle_s)
            except TimeoutError:
                raise _Cut(f"request body stalled for {self.body_idle_s:g} s", 408) from None
            cl.pull(data)

    def _pooled(self, now_s: float) -> _Upstream | None:
        """The most recently used idle engine connection that may carry a request, or None; those that may not
        (the engine closed them after their reply, as llama-server closes each stream's, or they idled too long)
        are closed on the way."""
        while self._pool:
            up = self._pool.pop()
            if up.reusable(now_s):
                return up
            up.close()
        return None

    async def _upstream(self, cl: _Client) -> _Upstream:
        now = self._clock()
        if cl.up is None:
            cl.up = self._pooled(now)
        up = cl.up
        if up is not None and up.reusable(now):
            up.reused = True
            return up
        if up is not None:
            up.close()
            cl.up = None
        try:  # asyncio.timeout, not wait_for: no task of its own for each connection (one per streamed request)
            async with asyncio.timeout(PROXY_UPSTREAM_CONNECT_S):
                _transport, conn = await asyncio.get_running_loop().create_connection(_Conn, *self.upstream)
        except (OSError, TimeoutError) as e:
            raise _Cut(f"engine unreachable: {e}", 502) from None
        cl.up = _Upstream(conn, self._clock())
        return cl.up

    async def _wait_engine(self, cl: _Client) -> None:
        """Until the engine takes requests, at most `engine_wait_s` (then 503); ConnectionResetError when the
        client leaves meanwhile."""
        ready = self._engine_ready
        assert ready is not None
        if ready.is_set():
            return
        await cl.conn.attach()  # (the client's leaving is seen on its transport)
        waiter = asyncio.ensure_future(ready.wait())
        cl.conn.on_lost = lambda: (waiter.cancel(), None)[1]
        try:
            async with asyncio.timeout(self.engine_wait_s):
                await waiter
        except TimeoutError:
            raise _Cut(f"the engine is still loading its model after {self.engine_wait_s:g} s", 503) from None
        except asyncio.CancelledError:
            if not cl.conn.lost:
                raise
            raise ConnectionResetError("the client left") from None
        finally:
            cl.conn.on_lost = None
            waiter.cancel()

    async def _exchange(self, cl: _Client, req: _Head) -> bool:
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
                ex.status = 405
                _answer(cl, 405, {"error": "CONNECT is not supported"}, close=True)
                return False
            ready = self._engine_ready
            if path == HEALTH_PATH and method in ("GET", "HEAD") and ready is not None and not ready.is_set():
                await self._discard_body(cl)
                ex.first_byte_s, ex.status = self._clock(), 503
                _answer(cl, 503, LOADING_BODY, head_only=method == "HEAD")
                return True
            await self._wait_engine(cl)
            if self._seed_view is not None and method in ("GET", "HEAD") and path == PEERS_PATH:
                await self._discard_body(cl)
                ex.first_byte_s, ex.status = self._clock(), 200
                _answer(cl, 200, await self._seed(), head_only=method == "HEAD")
                return True
            props = self._seed_view is not None and method == "GET" and path == PROPS_PATH
            return await self._forward(cl, req, work, props, ex)
        except _Cut as e:  # answered by _serve_client with its status when no response has begun
            ex.cut_status = e.status
            raise
        finally:
            if ex.demand:
                self._demand(-1)
            if work:
                self._timed_end(ex)
            self.timings.append(
                RequestTiming(start, ex.first_byte_s, self._clock(), method[:16], target[:200], ex.status)
            )

    def _timed_end(self, ex: _Exchange) -> None:
        """A work request's end for the latency recorder, whatever happened: one that never reached the engine
        (its body broke, the engine could not be reached or did not load in time) counts from its head, with
        the status the proxy answered it (None: the client left)."""
        now = self._clock()
        r = ex.rec if ex.rec is not None else self.latency.begin(ex.start_s)
        if r.status is None:
            status = ex.status if ex.status is not None else ex.cut_status
            if status is not None:
                self.latency.head(r, now, status, False)
        self.latency.end(r, now)

    async def _discard_body(self, cl: _Client) -> None:
        """Read (and drop) a request body we answer ourselves, at most PROXY_PIPELINE_BUFFER_BYTES of it."""
        n = 0
        while not isinstance(ev := await self._client_event(cl), _End):
            n += len(ev.data)
            if n > PROXY_PIPELINE_BUFFER_BYTES:
                raise _Cut("request body too large", 413)

    async def _forward(self, cl: _Client, req: _Head, work: bool, props: bool, ex: _Exchange) -> bool:
        headers = hop_filtered(req.headers)
        if not any(n.lower() == b"host" for n, _v in headers):
            headers.append((b"Host", f"{self.upstream[0]}:{self.upstream[1]}".encode()))
        # the request as sent so far, kept for a resend (see _Unanswered) while within PROXY_RESEND_MAX_BYTES
        chunked = any(n.lower() == b"transfer-encoding" for n, _v in req.headers)  # llhttp checked: chunked last
        sent = _Sent(request_head(req.method, req.target, headers), chunked)
        complete = False
        while not complete and (ev := _client_poll(cl)) is not NEED_DATA:
            sent.add(_body_event(ev))
            complete = isinstance(ev, _End)
        up: _Upstream | None = None

        def failed(e: BaseException) -> None:  # the client left, or its body broke: the reply's wait ends
            if up is not None:
                up.conn.abort(e)
            if ex.relay is not None:
                ex.relay.fail(e)

        def body_ended(task: asyncio.Task) -> None:
            if not task.cancelled() and task.exception() is not None:
                failed(task.exception())  # type: ignore[arg-type]

        cl.conn.on_lost = lambda: failed(ConnectionResetError("the client left"))
        body: asyncio.Task | None = None
        try:
            if cl.up is None:  # a kept engine connection carries it, else a new one (a closed one is no reason)
                cl.up = self._pooled(self._clock())
            in_c = complete and cl.up is None and self._in_c(cl, req, props, sent)
            if in_c:  # a new engine connection: the C relay makes the request
                self._body_done(cl, None, work, ex)
                up = await self._request_in_c(cl, ex, b"".join(sent.parts or ()), work)
                if up is None:  # the reply went there whole (or failed: raised)
                    return cl.request_ended
                await self._pump_reply(cl, up, req, props, ex)  # its head is the loop's to read
            if not in_c:
                await cl.conn.attach()  # (its transport sees the client leave; the relay writes to it)
            while not in_c:
                up = await self._upstream(cl)
                try:
                    self._send(up, sent, ex)
                    up.clean = False  # until its reply has ended as it should
                    if cl.conn.lost:
                        raise ConnectionResetError("the client left")
                    if complete:
                        self._body_done(cl, up, work, ex)
                    elif body is None:
                        body = asyncio.create_task(self._pump_body(cl, up, work, ex, sent))
                        body.add_done_callback(body_ended)
                    await self._pump_reply(cl, up, req, props, ex)
                    break
                except _Unanswered:
                    if sent.parts is None:
                        raise
                    # a kept-alive connection the engine closed as the request crossed: again, on another
                    up.close()
                    cl.up = None
                    if body is not None:
                        body.remove_done_callback(body_ended)
                        body.cancel()
                        await asyncio.gather(body, return_exceptions=True)
                        body = None
                    complete = sent.complete
        finally:
            cl.conn.on_lost = cl.conn.on_eof = None
            if body is not None and not body.done():
                body.remove_done_callback(body_ended)
                body.cancel()
                await asyncio.gather(body, return_exceptions=True)
        assert up is not None
        up.idle_since_s = self._clock()
        cl.up = None
        if up.clean and sent.complete:  # free at once for the next request, this client's or another's
            self._release(up)  # (held until the client left, it was missed by the next client of a stream)
        else:
            up.close()
        return cl.request_ended

    def _send(self, up: _Upstream, sent: _Sent, ex: _Exchange) -> None:
        """The request as received so far to the engine, in one write."""
        assert sent.parts is not None
        try:
            up.conn.write(b"".join(sent.parts))
        except OSError as e:
            raise _engine_failed(up, ex, e) from None

    def _work_begun(self, work: bool, ex: _Exchange) -> None:
        """DEMAND from now, for a work request (once)."""
        if work and not ex.demand:
            self._demand(+1)
            ex.demand = True

    def _body_done(self, cl: _Client, up: _Upstream | None, work: bool, ex: _Exchange) -> None:
        """The request's body is all sent: DEMAND from now (`up` None: the C relay makes the request, and DEMAND
        is told once it has it: `_request_in_c`); the client's EOF, with nothing more from it, is passed on to the
        engine as a half-close (now, or when it comes) while the reply has not ended (`up` None: the C relay
        half-closes for it while it has it)."""
        if up is not None:
            self._work_begun(work, ex)
        if work and ex.rec is None:  # TTFT and e2e count from here (a resend does not restart them)
            ex.rec = self.latency.begin(self._clock())

        def at_eof() -> None:
            if not cl.conn.eof or cl.buffered() or cl.conn.lost:
                return
            relay, relayer = ex.relay, self._relayer
            if relay is not None and relay.token is not None and relayer is not None:
                self._relay_reports()  # the C relay may have ended the reply, its report not yet read
            if relay is not None and relay.ended:
                return  # the reply is over: the engine needs no EOF, its connection stays reusable
            if up is None:
                if relay is not None and relay.token is not None and relayer is not None:
                    relayer.half_close(relay.token)
                return
            if not up.half_closed:
                up.half_closed = True
                try:
                    if up.conn.transport is not None:
                        up.conn.transport.write_eof()
                except (OSError, RuntimeError):
                    pass

        at_eof()
        cl.conn.on_eof = at_eof

    async def _pump_body(self, cl: _Client, up: _Upstream, work: bool, ex: _Exchange, sent: _Sent) -> None:
        """The rest of the request's body to the engine; DEMAND from its end."""
        while True:
            ev = _body_event(await self._client_event(cl))
            try:
                up.conn.write(sent.add(ev))
                await up.conn.drain()
            except OSError as e:
                raise _engine_failed(up, ex, e) from None
            if isinstance(ev, _End):
                self._body_done(cl, up, work, ex)
                return

    async def _pump_reply(self, cl: _Client, up: _Upstream, req: _Head, props: bool, ex: _Exchange) -> None:
        """The engine's response to the client: 1xx relayed (an HTTP/1.0 client gets none), the head, the body
        as it comes (each chunk of a stream at once); a /props reply to `props` with gpu_share added."""
        buf = b""
        while True:
            got = parse_response_head(buf) if buf else None
            if got is None:
                data = await up.conn.read()
                if data:
                    if ex.first_byte_s is None:
                        ex.first_byte_s = self._clock()
                    buf += data
                    continue
                if ex.first_byte_s is None and up.reused:
                    raise _Unanswered("engine closed before its reply", 502)
                raise _Cut("engine closed before its reply", 502)
            ev, end = got
            buf = buf[end:]
            if ev.status_code >= 200:
                break
            if ev.status_code == 101:
                raise _Cut("engine switched protocols unasked", 502)
            if req.http_version != b"1.0":
                cl.conn.write(informational(ev.status_code, ev.reason, hop_filtered(ev.headers)))
        ex.status = ev.status_code
        framing, length = body_framing(req.method, ev)
        keep_alive = ev.http_version == b"1.1" and not any(
            n == b"connection" and b"close" in v.lower() for n, v in ev.lowered
        )
        held: list[bytes] | None = [] if props and ev.status_code == 200 else None
        # a chunked stream to an HTTP/1.1 client passes as it came (framing it anew would write the same chunks)
        raw = framing == "chunked" and held is None and req.http_version == b"1.1"
        relay = _Relay(cl, ev, framing, length, raw, held)
        ex.relay = relay
        if ex.rec is not None:
            ctype = next((v for n, v in ev.lowered if n == b"content-type"), b"")
            self.latency.head(ex.rec, self._clock(), ev.status_code, is_stream_content_type(ctype))
            relay.rec, relay.rec_req, relay.clock = self.latency, ex.rec, self._clock
        if relay.quick and self._relayer is not None:
            relay.up, relay.offload = up.conn, self._offload
        if held is None:
            cl.conn.write(cl.response_head(ev.status_code, ev.reason, hop_filtered(ev.headers)))
        rest = buf
        if framing == "length" and length == 0:  # no body
            relay.extra = bool(rest)
            relay.end()
        else:
            up.conn.sink, cl.conn.feeder = relay.feed, up.conn
            if rest:
                relay.feed(rest)
            if up.conn.eof:
                relay.feed(b"")
            elif relay.offload is not None and relay.quick:  # at the head: the first token is the C relay's too
                relay.offload(relay)
        try:
            await relay.done
        finally:
            relay.unload()
            up.conn.sink, cl.conn.feeder = None, None
            paused = cl.conn.write_paused  # the engine's reads were paused for it: not resumed, not reused
        up.clean = keep_alive and not relay.extra and framing != "close" and not paused
        if relay.held is not None:
            added = with_gpu_share(b"".join(relay.held), {"enabled": True, **await self._seed()})
            if added is None:
                relay.release()
            else:
                headers = _with_length(hop_filtered(ev.headers), len(added))
                cl.conn.write(cl.response_head(ev.status_code, ev.reason, headers) + cl.body(added))
        await _reply_end(cl, relay)

    def _in_c(self, cl: _Client, req: _Head, props: bool, sent: _Sent) -> bool:
        """Whether the C relay makes this request (whole, on a new engine connection: `_request_in_c`): an
        HTTP/1.1 client's (a reply it relays is chunked), not HEAD, not a /props the loop adds to, the engine's
        address numeric."""
        return (
            self._relayer is not None
            and self._engine_addr is not None
            and sent.parts is not None
            and req.http_version == b"1.1"
            and req.method != b"HEAD"
            and not props
            and cl.conn.fd >= 0
        )

    async def _request_in_c(self, cl: _Client, ex: _Exchange, data: bytes, work: bool) -> _Upstream | None:
        """The request (`data`: all of it) on a new engine connection, the connect, the write, the reply's head
        and body made by the C relay (_relay.c), DEMAND told once it has it (not before: the line to the
        supervisor, and what it wakes there, would be on the request's way): None when the reply went there to
        its end (_Cut or ConnectionResetError raised where it failed); where its head is not plain, the
        connection, adopted by the loop with what came of the reply, for `_pump_reply` to read."""
        relayer = self._relayer
        assert relayer is not None and cl.req is not None
        try:
            sock = self._engine_socket()
        except OSError as e:  # refused, or out of fds
            raise _Cut(f"engine unreachable: {e}", 502) from None
        relay = _Relay(cl, ResponseHead(), "chunked", 0, True, None)
        relay.engine_sock = sock  # closed at the end, unless adopted

        def on_head(head: tuple[float, int, float, int, int]) -> None:
            first_byte_s, status, head_s, streamed, written = head
            if ex.first_byte_s is None:
                ex.first_byte_s = first_byte_s
            if status and ex.status is None:
                ex.status = status
                if ex.rec is not None:
                    self.latency.head(ex.rec, head_s, status, bool(streamed))
                if written:
                    cl.head_written_chunked()
                    self.relayed_in_c_total += 1

        try:
            relay.on_head = on_head
            if ex.rec is not None:
                relay.rec, relay.rec_req, relay.clock = self.latency, ex.rec, self._clock
            try:
                token = relayer.request(
                    sock.fileno(),
                    cl.conn.fd,
                    data,
                    not cl.req.keep_alive,
                    ex.rec is not None,
                    PROXY_RELAY_HOLD_MAX_BYTES,
                    PROXY_UPSTREAM_CONNECT_S,
                )
            except (OSError, RuntimeError) as e:  # out of fds or memory
                raise _Cut(f"engine unreachable: {e}", 502) from None
            relay.token, relay.owner = token, self
            self._relayed[token] = relay
            self.requests_in_c_total += 1
            ex.relay = relay
            self._work_begun(work, ex)
            self._make_spare()  # (the request is on its way: this connect is not)
            if cl.conn.sock is not None:  # the request is on its way: the client's socket is made the loop's now
                await cl.conn.attach()
                relay.transport = cl.conn.transport
            if cl.conn.on_eof is not None:
                cl.conn.on_eof()  # the client's EOF, if it came already
            back = await relay.done
            if back is not None:  # the loop goes on with the engine's connection
                relay.engine_sock = None  # (the transport's, from here)
                try:
                    _transport, conn = await asyncio.get_running_loop().create_connection(_Conn, sock=sock)
                except OSError as e:  # the engine reset it meanwhile
                    raise _Cut(f"engine: {e}", 502) from None
                up = cl.up = _Upstream(conn, self._clock())
                if back[1] == _relay.HEAD:
                    conn.buf[:0] = back[6]  # what came, the head and any of the body after it, before what came since
                    return up
                # its body's framing is the loop's to scan from here (see _Relay.taken_back)
                up.clean = False  # (not reused: made for this request)
                relay.up, relay.done = conn, conn.loop.create_future()
                conn.sink, cl.conn.feeder = relay.feed, conn
                relay.resume(back)
                if conn.buf:  # what the loop read before the sink was set
                    relay.feed(conn.take())
                if conn.eof:
                    relay.feed(b"")
                try:
                    await relay.done
                finally:
                    conn.sink, cl.conn.feeder = None, None
            await _reply_end(cl, relay)
            return None
        finally:
            relay.unload()
            if relay.engine_sock is not None:
                sock.close()

    def _engine_socket(self) -> socket.socket:
        """A socket to the engine's numeric address, its connect begun: the one made ahead where it is still
        quiet (connected or connecting, nothing from the engine; the connect is ~50-90 µs of the loop's time on
        a request's way), else a new one. OSError where none can be made."""
        spare = self._take_spare()
        if spare is not None:
            try:
                spare.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                return spare
            except OSError:  # refused, reset
                pass
            spare.close()  # (closed by the engine, or it wrote unasked)
        addr = self._engine_addr
        assert addr is not None
        sock = socket.socket(addr[0], socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            err = sock.connect_ex(addr[1])
            if err not in (0, errno.EINPROGRESS):
                raise OSError(err, os.strerror(err))
        except OSError:
            sock.close()
            raise
        return sock

    def _make_spare(self) -> None:
        """An engine connection made ahead for the next request (at most one), closed unused after
        UPSTREAM_REUSE_IDLE_S: it holds an engine's HTTP thread while it waits."""
        if self._spare is not None or self._closing or self._loop is None:
            return
        try:
            self._spare = self._engine_socket()
        except OSError:  # the next request meets it
            return
        self._spare_timer = self._loop.call_later(UPSTREAM_REUSE_IDLE_S, self._drop_spare)

    def _take_spare(self) -> socket.socket | None:
        """The engine connection made ahead, if any, no longer the proxy's to close (its timer cancelled)."""
        spare, self._spare = self._spare, None
        if self._spare_timer is not None:
            self._spare_timer.cancel()
            self._spare_timer = None
        return spare

    def _drop_spare(self) -> None:
        spare = self._take_spare()
        if spare is not None:
            spare.close()

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
    rec: Request | None = None  # its latency record, from its body's end (work requests)
    cut_status: int | None = None  # the status the proxy answers it with, when it ends it (a _Cut)
    relay: _Relay | None = None  # its reply's body, from the reply's head on


async def _reply_end(cl: _Client, relay: _Relay) -> None:
    """The response's end to the client, once its body was relayed: its last chunk and trailers where it is
    chunked (but where the C relay wrote the last chunk), then until the client has taken it all but the high-water
    mark."""
    tail = cl.end(hop_filtered(relay.trailers))  # trailers only where the reply is chunked
    if not relay.last_written:  # (the C relay writes `0 CRLF CRLF`, what this is without trailers)
        cl.conn.write(tail)
    await cl.conn.drain()


def _start_eagerly(coro: Coroutine[Any, Any, None]) -> asyncio.Task | None:
    """Run `coro` now, on the caller's stack, to its first suspension (Python 3.12's eager tasks), then a Task
    carries it on (returned; None when it ended first). Until it suspends there is no current task: it must not
    need one (asyncio.timeout, current_task) before. An exception it raises before is raised here."""
    try:
        waits_on = coro.send(None)
    except StopIteration:
        return None
    return asyncio.ensure_future(_carried_on(coro, waits_on))


async def _carried_on(coro: Coroutine[Any, Any, None], waits_on: Any) -> None:
    await _resumed(coro, waits_on)


@types.coroutine
def _resumed(coro: Coroutine[Any, Any, None], waits_on: Any) -> Generator[Any, None, None]:
    """`coro`, suspended on `waits_on` (what it yielded: a future, or None for a bare yield), driven by the
    Task that drives this: each wake-up sent on, each exception (a cancel) thrown in."""
    while True:
        try:
            yield waits_on
        except BaseException as e:
            try:
                waits_on = coro.throw(e)
            except StopIteration:
                return
        else:
            try:
                waits_on = coro.send(None)
            except StopIteration:
                return


def _numeric_address(addr: tuple[str, int]) -> tuple[int, Any] | None:
    """(family, sockaddr) of a numeric host and its port; None for a name (the loop resolves it at each connect)."""
    try:
        info = socket.getaddrinfo(addr[0], addr[1], type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except (OSError, UnicodeError, OverflowError, TypeError):
        return None
    return (info[0][0], info[0][4]) if info else None


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def _whole_chunks(data: bytes) -> int:
    """How far `data` is whole chunks but the last (`SIZE CRLF DATA CRLF`..., no extension): the stream's common
    case, scanned without a regex; the rest is left to the full scan."""
    pos, end = 0, len(data)
    while True:
        nl = data.find(b"\r\n", pos, pos + 22)
        if nl <= pos or data[pos:nl].lstrip(HEX_DIGITS):  # not 1-20 hex digits then CRLF
            return pos
        size = int(data[pos:nl], 16)
        after = nl + 2 + size
        if not size or after + 2 > end or data[after : after + 2] != b"\r\n":
            return pos
        pos = after + 2
        if pos == end:
            return pos


def listen_socket(listen: tuple[str, int]) -> socket.socket:
    """A TCP socket listening on `listen` (core/host/listen_fds.bind_listening); ProxyError if it cannot."""
    try:
        return bind_listening(listen, LISTEN_BACKLOG)
    except ListenFdError as e:
        raise ProxyError(f"front proxy {e}") from None


def _with_length(headers: list[tuple[bytes, bytes]], n: int) -> list[tuple[bytes, bytes]]:
    out = [(k, v) for k, v in headers if k.lower() not in (b"content-length", b"transfer-encoding")]
    return [*out, (b"Content-Length", b"%d" % n)]


def _client_poll(cl: _Client) -> Any:
    """The client's next event (_Head, _Body, _End) from what is buffered (its connection's bytes read first);
    NEED_DATA, or CLOSED when it ended between requests."""
    r = cl.reader
    if not r.events and cl.conn.buf:
        r.feed(cl.conn.take())
    if r.events:
        ev = r.events.popleft()
        if type(ev) is _Body:
            r.body_bytes -= len(ev.data)
        elif type(ev) is _End:
            cl.request_ended = True
        return ev
    if r.error is not None:
        raise r.error
    if cl.conn.eof and not cl.conn.buf:
        if r.in_message:
            raise _Cut("the client closed inside its request", 400)
        return CLOSED
    return NEED_DATA


def _body_event(ev: Any) -> Any:
    """A request body's event as the engine is sent it (its trailers less the hop-by-hop ones)."""
    if type(ev) is _Body:
        return ev
    if type(ev) is _End:
        return _End(hop_filtered(ev.trailers)) if ev.trailers else ev
    raise _Cut(f"unexpected {type(ev).__name__} in a request body", 400)


def _answer(cl: _Client, status: int, doc: dict, *, head_only: bool = False, close: bool = False) -> None:
    """A JSON reply of our own (no response may have begun)."""
    body = (json.dumps(doc, allow_nan=False) + "\n").encode()
    headers = [(b"Content-Type", b"application/json"), (b"Content-Length", b"%d" % len(body))]
    if close:
        cl.req = None  # the connection ends after it: Connection: close
    try:
        cl.conn.write(cl.response_head(status, b"", headers) + (b"" if head_only else body) + cl.end([]))
    except OSError:
        pass


def _name_thread(name: bytes) -> None:
    """This OS thread's name (at most 15 bytes), where the C library lets us set it."""
    try:
        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket, timeout_s: float | None = None) -> None:
    """Until `sock` is readable (TimeoutError after `timeout_s`)."""
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(sock.fileno(), ready)
    timer = loop.call_later(timeout_s, _expire, fut) if timeout_s is not None else None
    try:
        await fut
    finally:
        loop.remove_reader(sock.fileno())
        if timer is not None:
            timer.cancel()
