"""core/engines/front_proxy.py: requests pass through unchanged, and DEMAND rises when the first request in flight
arrives and falls when the last response ends (Content-Length, chunked streaming, close-delimited); bad
framing closes the connection; a real llama-server streams through it."""

from __future__ import annotations

import io
import json
import os
import select
import socket
import socketserver
import subprocess
import sys
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare_tui.core.engines.front_proxy import DEMAND_FALL_GRACE_S, MAX_HEAD_BYTES, FrontProxy, ProxyError
from testkit.wait import wait_for


class _Upstream(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    # (socketserver's 5: a burst of connects overflows it, and one caught as its last ACK is dropped waits out
    # TCP's retransmission backoff, tens of seconds on a loaded machine, through any proxy or none)
    request_queue_size = 128

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.release = threading.Event()  # lets /stream send its last chunks
        self.bodies: list[bytes] = []
        self.props = b'{"a": 1}'
        self.raw_body: list[bytes] = []  # /raw: a chunked reply's body bytes as the test made them, a write each
        self.raw_head = b""  # /head: the whole reply as the test made it (then the origin closes)
        self.connections = 0  # accepted
        self.used = 0  # connections that carried a request
        self.ended = 0  # connections ended
        self.idle_answer: bytes | None = None  # not None: a connection with no request in 50 ms gets it, then closed
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server_address[1]


class _Handler(socketserver.StreamRequestHandler):
    """A small HTTP/1.1 origin: /len (Content-Length), /stream (chunked, 3 events then waits for `release`,
    then 2 more), /eof (delimited by closing), /echo (the request body back); keep-alive otherwise."""

    def handle(self) -> None:
        srv: _Upstream = self.server  # type: ignore[assignment]
        srv.connections += 1
        try:
            self._serve(srv)
        finally:
            srv.ended += 1

    def _serve(self, srv: _Upstream) -> None:
        if srv.idle_answer is not None and not select.select([self.connection], [], [], 0.05)[0]:
            self.wfile.write(srv.idle_answer)  # (b"": just closed, as an origin with a short idle timeout)
            self.wfile.flush()
            return
        used = False
        while True:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = self.rfile.readline()
                if not line:
                    return
                head += line
            if not used:
                used = True
                srv.used += 1
            lines = head.decode().split("\r\n")
            path = lines[0].split(" ")[1]
            length = next((int(h.split(":")[1]) for h in lines if h.lower().startswith("content-length:")), 0)
            body = self.rfile.read(length) if length else b""
            if any(h.lower() == "transfer-encoding: chunked" for h in lines):  # answered once it ended, as an engine
                read = _dechunked_request(self.rfile)
                if read is None:  # cut before its end (the proxy refused the rest): nothing answered, nothing kept
                    return
                body = read
            srv.bodies.append(body)
            w = self.wfile
            if path == "/len":
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            elif path == "/echo":
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            elif path == "/stream":
                w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n")
                for i in range(5):
                    if i == 3:
                        w.flush()
                        srv.release.wait(10)
                    event = b"data: %d\n\n" % i
                    w.write(b"%x\r\n%s\r\n" % (len(event), event))
                    w.flush()
                w.write(b"0\r\n\r\n")
            elif path == "/bye":  # a keep-alive response, then the origin closes (an idle timeout)
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbye")
                w.flush()
                return
            elif path == "/closing":  # a keep-alive response, then the origin closes as the next request comes
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nclosing")
                w.flush()
                self.rfile.readline()  # the next request's first line: closed unanswered (the idle-timeout race)
                return
            elif path == "/closing-late":  # the same, the next request read whole before the close
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nclosing")
                w.flush()
                head = b""
                while not head.endswith(b"\r\n\r\n") and (line := self.rfile.readline()):
                    head += line
                sizes = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")]
                self.rfile.read(sizes[0] if sizes else 0)
                return
            elif path == "/props":  # whatever the test set (a JSON object, something else, a large one)
                props = srv.props
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(props))
                w.write(props)
            elif path == "/raw":  # a chunked head, then whatever bytes the test set (well formed or not)
                w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                for piece in srv.raw_body:
                    w.flush()
                    time.sleep(0.0005)  # separate reads, most of the time
                    w.write(piece)
                w.flush()
                return  # then closes: a reply cut short ends there
            elif path == "/head":
                w.write(srv.raw_head)
                w.flush()
                return
            elif path == "/eof":
                w.write(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
                w.flush()
                return
            else:
                w.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            w.flush()


@pytest.fixture
def upstream():
    srv = _Upstream()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


def _dechunked_request(rfile: io.BufferedIOBase) -> bytes | None:
    """A chunked request body's data, read through its last chunk and trailers; None where the connection ended
    first."""
    data = b""
    while True:
        size_line = rfile.readline()
        if not size_line.endswith(b"\n"):
            return None
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        chunk = rfile.read(size + 2)
        if len(chunk) < size + 2:
            return None
        data += chunk[:size]
    while (line := rfile.readline()) not in (b"\r\n", b"\n"):  # trailers, to the blank line
        if not line:
            return None
    return data


@pytest.fixture
def proxy(upstream):
    changes: list[bool] = []
    p = FrontProxy(("127.0.0.1", 0), ("127.0.0.1", upstream.port), on_demand=changes.append).start()
    p.changes = changes  # type: ignore[attr-defined]
    yield p
    p.close()
    assert p.errors_total == 0  # no connection ended by a bug (a client's retry would hide it)


def test_requests_pass_through_and_demand_follows_each_one(proxy) -> None:
    url = f"http://127.0.0.1:{proxy.port}"
    with httpx.Client() as c:  # one keep-alive connection for all three, each past DEMAND's fall grace
        assert c.get(url + "/len").text == "hello"
        time.sleep(DEMAND_FALL_GRACE_S + 0.05)
        assert c.post(url + "/echo", content=b"x" * 100_000).content == b"x" * 100_000
        time.sleep(DEMAND_FALL_GRACE_S + 0.05)
        assert c.get(url + "/len").text == "hello"
    wait_for(lambda: len(proxy.changes) == 6, 5, what="three rises and falls")
    assert proxy.changes == [True, False] * 3 and proxy.in_flight == 0 and proxy.requests_total == 3
    t = list(proxy.timings)
    assert [(x.method, x.path, x.status) for x in t] == [
        ("GET", "/len", 200),
        ("POST", "/echo", 200),
        ("GET", "/len", 200),
    ]
    assert all(x.start_s <= (x.first_byte_s or 0) <= x.end_s for x in t)


def test_a_stream_is_forwarded_as_it_comes_and_demand_lasts_until_its_end(proxy, upstream) -> None:
    with httpx.Client() as c, c.stream("GET", f"http://127.0.0.1:{proxy.port}/stream") as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]  # 3 events (each a line and a blank) before the upstream finishes
        assert [x for x in got if x] == ["data: 0", "data: 1", "data: 2"]
        assert proxy.in_flight == 1 and proxy.changes == [True]  # the response is still going
        upstream.release.set()
        rest = [x for x in lines if x]
    assert rest == ["data: 3", "data: 4"]
    wait_for(lambda: proxy.changes == [True, False], 5, what="demand to fall at the stream's end")


def test_two_requests_in_flight_raise_demand_once(proxy, upstream) -> None:
    url = f"http://127.0.0.1:{proxy.port}/stream"
    done: list[str] = []

    def stream() -> None:
        with httpx.Client() as c:
            done.append(c.get(url).text)

    threads = [threading.Thread(target=stream) for _ in range(2)]
    for t in threads:
        t.start()
    wait_for(lambda: proxy.in_flight == 2, 5, what="both requests in flight")
    assert proxy.changes == [True]
    upstream.release.set()
    for t in threads:
        t.join(10)
    assert len(done) == 2
    wait_for(lambda: proxy.changes == [True, False], 5, what="DEMAND to fall once, after both")  # just after the end


def test_a_request_that_follows_the_last_within_the_grace_keeps_demand_up(proxy) -> None:
    """Two requests pipelined on one connection: the second begins as the first ends, so DEMAND rises once and
    falls once (not a fall and a rise between them: a line to the supervisor each, and a round of its pace loop);
    it falls DEMAND_FALL_GRACE_S after the second, not before."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(b"GET /len HTTP/1.1\r\nHost: x\r\n\r\nGET /len HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = _read_all(s)
    assert reply.count(b"HTTP/1.1 200 ") == 2 and reply.endswith(b"hello"), reply
    ended = time.monotonic()
    wait_for(lambda: proxy.changes == [True, False], 5, what=f"one rise and one fall, not {proxy.changes}")
    fell_s = proxy.demand_changes[-1][0]
    # libuv's timers count whole milliseconds from the loop's cached time, and the request's end is timed just
    # after the fall's timer is armed: the fall may come up to ~1 ms before the grace by time.monotonic
    assert fell_s - proxy.timings[-1].end_s >= DEMAND_FALL_GRACE_S - 0.0015 and fell_s >= ended - 1.0
    time.sleep(DEMAND_FALL_GRACE_S + 0.05)
    assert proxy.changes == [True, False]


def test_a_response_delimited_by_close(proxy) -> None:
    assert httpx.get(f"http://127.0.0.1:{proxy.port}/eof").text == "until the end"
    wait_for(lambda: proxy.changes == [True, False], 5, what="demand to fall when the engine closes")


def test_bad_framing_closes_the_connection_and_leaves_no_demand(proxy) -> None:
    for bad in (
        b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n",
    ):
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
            try:
                s.sendall(bad)
                reply = _read_all(s)  # a 4xx of h11's, then closed; nothing forwarded
                assert reply == b"" or reply.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 431 ")), reply[:80]
            except ConnectionResetError:
                pass
    body_short = b"POST /echo HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
        s.sendall(body_short)
        s.shutdown(socket.SHUT_WR)  # the client goes away inside its body
        reply = _read_all(s)
        assert reply == b"" or reply.startswith(b"HTTP/1.1 400 "), reply[:80]
    wait_for(lambda: proxy.in_flight == 0, 5, what="the cut request to end")
    time.sleep(DEMAND_FALL_GRACE_S + 0.05)
    assert proxy.changes in ([], [True, False])
    assert httpx.get(f"http://127.0.0.1:{proxy.port}/len").text == "hello"  # still serving


def test_an_engine_connection_is_free_for_the_next_client_once_its_reply_ended(proxy, upstream) -> None:
    """A kept-alive client that stays connected does not keep the engine connection its reply came on: the next
    client's request goes on it (one engine connection for both), and the first client's next one too."""
    with httpx.Client() as kept:
        assert kept.get(f"http://127.0.0.1:{proxy.port}/len").text == "hello"
        assert httpx.get(f"http://127.0.0.1:{proxy.port}/len").text == "hello"  # another client, meanwhile
        assert kept.get(f"http://127.0.0.1:{proxy.port}/len").text == "hello"
    # (and one more made ahead for a next request: unused)
    assert upstream.used == 1 and upstream.connections <= 2 and proxy.requests_total == 3


@pytest.mark.parametrize("idle_answer", [None, b"", b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n"])
def test_one_engine_connection_is_made_ahead_and_one_the_engine_ended_or_wrote_to_is_not_used(
    proxy, upstream, idle_answer: bytes | None
) -> None:
    """A request the C relay makes on a new engine connection (a stream: each ends its connection, as
    llama-server's) has the next one's connect made ahead, off its way: at most one, closed unused after
    UPSTREAM_REUSE_IDLE_S. One the engine closed meanwhile, or wrote to unasked, is not used: the next request
    goes on a new one (on it, it would have failed: a 502, or the engine's bytes taken for its reply)."""
    from gpushare_tui.core.engines.front_proxy import UPSTREAM_REUSE_IDLE_S

    upstream.release.set()
    upstream.idle_answer = idle_answer
    url = f"http://127.0.0.1:{proxy.port}/stream"
    stream = "".join(f"data: {i}\n\n" for i in range(5))
    assert httpx.get(url).text == stream
    wait_for(lambda: upstream.connections == 2, 5, what="a connection made ahead")
    if idle_answer is None:
        assert httpx.get(url).text == stream  # on it
        wait_for(lambda: upstream.connections == 3, 5, what="the next one made ahead")
        assert upstream.used == 2 and proxy.requests_in_c_total == 2
        time.sleep(UPSTREAM_REUSE_IDLE_S)
        wait_for(lambda: upstream.ended == 3, 5, what="the one made ahead to be closed unused")
        assert upstream.used == 2 and upstream.connections == 3
        return
    for n in range(2, 5):
        wait_for(lambda: upstream.ended == upstream.connections, 5, what="the engine to end the one made ahead")
        reply = httpx.get(url)
        assert reply.status_code == 200 and reply.text == stream, reply.text
        assert upstream.used == n
    assert proxy.requests_in_c_total == 4


def test_the_engine_closing_an_idle_keepalive_connection_is_reconnected(proxy, upstream) -> None:
    """llama-server closes a keep-alive connection idle for 5 s; the client's next request on its own
    kept-alive connection to the proxy goes to a new engine connection, not to a closed one."""
    with httpx.Client() as c:
        assert c.get(f"http://127.0.0.1:{proxy.port}/bye").text == "bye"  # the origin closes after it
        time.sleep(0.2)
        assert c.get(f"http://127.0.0.1:{proxy.port}/len").text == "hello"
    assert proxy.requests_total == 2


def test_a_request_on_a_connection_the_engine_closes_as_it_crosses_is_sent_again(proxy, upstream) -> None:
    """The engine may close a kept-alive connection as idle while a request is on its way, before the FIN
    reached the proxy: it never read that request, which goes again on another connection (not a 502)."""
    url = f"http://127.0.0.1:{proxy.port}"
    assert httpx.get(url + "/closing").text == "closing"  # its engine connection is pooled for the next client
    time.sleep(DEMAND_FALL_GRACE_S + 0.05)  # each request its own DEMAND rise and fall
    assert httpx.get(url + "/len").text == "hello"  # sent on it, unanswered: sent again
    time.sleep(DEMAND_FALL_GRACE_S + 0.05)
    assert httpx.get(url + "/closing").text == "closing"
    time.sleep(DEMAND_FALL_GRACE_S + 0.05)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:  # a body after the head
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nConnection: close\r\n\r\n")
        time.sleep(0.2)  # the head went alone; the engine closed on it; the body comes later
        s.sendall(b"abc")
        time.sleep(0.05)
        s.sendall(b"def")
        reply = _read_all(s)
    assert reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(b"\r\n\r\nabcdef"), reply
    assert upstream.bodies[-1] == b"abcdef" and proxy.in_flight == 0
    wait_for(lambda: proxy.changes[-1:] == [False], 5, what="demand dropped")
    assert proxy.changes == [True, False] * 4  # one rise per request, a resend included


def test_a_large_request_the_engine_closes_on_gets_one_clear_502(proxy, upstream) -> None:
    """A request whose body is over PROXY_RESEND_MAX_BYTES is not kept: when the engine closes its kept-alive
    connection unanswered after reading that much, the client gets 502, and the proxy serves the next request."""
    from gpushare_tui.core.host.budgets import PROXY_RESEND_MAX_BYTES

    url = f"http://127.0.0.1:{proxy.port}"
    assert httpx.get(url + "/closing-late").text == "closing"
    r = httpx.post(url + "/echo", content=b"x" * (PROXY_RESEND_MAX_BYTES + 1), timeout=10)
    assert r.status_code == 502 and r.json()["error"].startswith("engine"), (r.status_code, r.content[:200])
    assert httpx.get(url + "/len").text == "hello" and proxy.in_flight == 0


def test_health_checks_and_scrapes_are_no_work(proxy, upstream) -> None:
    with httpx.Client() as c:
        for path in ("/health", "/metrics?x=1", "/slots"):
            assert c.get(f"http://127.0.0.1:{proxy.port}{path}").status_code == 404
    # a timing is kept just after the response's last byte went out: the client may read it first
    wait_for(lambda: len(proxy.timings) == 3, 5, what="the last request's timing")
    assert proxy.requests_total == 3 and proxy.changes == []


def test_a_taken_port_is_one_clear_error(upstream) -> None:
    with pytest.raises(ProxyError, match=f"cannot listen on 127.0.0.1:{upstream.port}"):
        FrontProxy(("127.0.0.1", upstream.port), ("127.0.0.1", upstream.port)).start()


@pytest.mark.slow
@pytest.mark.llama
def test_a_real_llama_server_streams_through_the_proxy(tmp_path) -> None:
    """The same completion direct and through the proxy; DEMAND up during it, down within ms of its end."""
    from llama_env import find_llama_server

    from gpushare_tui.core.engines.llama_server import free_port
    from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS, write_tiny_llama

    server, why = find_llama_server()
    if server is None:
        pytest.skip(why)
    model = write_tiny_llama(str(tmp_path / "m.gguf"))
    port = free_port()
    import subprocess

    proc = subprocess.Popen(
        [server, "-m", model, "-t", "1", "-c", "512", "--port", str(port), "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: _healthy(port), 60, what="llama-server health")
        body = {"prompt": "the", "n_predict": 16, "ignore_eos": True, "stream": True, "seed": 1, "temperature": 0,
                "logit_bias": [[t, False] for t in NON_TEXT_TOKEN_IDS]}  # fmt: skip
        with FrontProxy(("127.0.0.1", 0), ("127.0.0.1", port)) as p, httpx.Client(timeout=60) as c:
            via = c.post(f"http://127.0.0.1:{p.port}/completion", json=body).text
            direct = c.post(f"http://127.0.0.1:{port}/completion", json=body).text
            wait_for(lambda: len(p.demand_changes) == 2, 5, what="the request to end and DEMAND to fall")
            changes = list(p.demand_changes)
            timing = p.timings[-1]
        assert via.count('"content"') == direct.count('"content"') == 17  # 16 tokens and the final event
        assert [up for _t, up in changes] == [True, False] and timing.path == "/completion"
        assert timing.first_byte_s is not None and timing.end_s - timing.start_s < 30
    finally:
        proc.kill()
        proc.wait()


def _read_all(s: socket.socket) -> bytes:
    out = b""
    while data := s.recv(65536):
        out += data
    return out


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# -- the seed's per-engine view (spec §5) ------------------------------------------------------------------

SEED = {"gpu_key": "k1", "period_ms": 100, "self": {"pid": 7, "weight": 1.5}, "peers": [{"pid": 7, "weight": 1.5}]}


@pytest.fixture
def seeded(upstream):
    calls: list[int] = []

    def view() -> dict:
        calls.append(1)
        return SEED

    p = FrontProxy(("127.0.0.1", 0), ("127.0.0.1", upstream.port), seed_view=view).start()
    p.calls = calls  # type: ignore[attr-defined]
    yield p
    p.close()
    assert p.errors_total == 0  # (a connection a bug ended is retried by httpx: unseen by the test's asserts)


def test_a_connection_whose_first_answer_was_the_proxys_own_carries_the_next_request(seeded) -> None:
    """/gpu/peers answered first on a new connection (written before its socket was the loop's transport), then
    another request on it: both answered on the one connection (the second ended it with a bug before)."""
    with socket.create_connection(("127.0.0.1", seeded.port), timeout=10) as s:
        for path in (b"/gpu/peers", b"/len", b"/gpu/peers"):
            time.sleep(0.1)  # the proxy waits for it (else it may come with the transport)
            s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path)
            reply = b""
            while b"\r\n\r\n" not in reply or len(reply.partition(b"\r\n\r\n")[2]) < int(
                reply.split(b"Content-Length: ")[1].split(b"\r\n")[0]
            ):
                data = s.recv(65536)
                assert data, (path, reply)
                reply += data
            assert reply.startswith(b"HTTP/1.1 200 "), (path, reply)
    assert seeded.requests_total == 3 and seeded.errors_total == 0


def test_gpu_peers_is_answered_by_the_proxy_and_props_gains_only_gpu_share(seeded, upstream) -> None:
    url = f"http://127.0.0.1:{seeded.port}"
    with httpx.Client() as c:
        r = c.get(url + "/gpu/peers")
        assert r.status_code == 200 and r.json() == SEED and upstream.bodies == []  # never reached the engine
        assert c.head(url + "/gpu/peers").status_code == 200
        for props in (b'{"a": 1, "b": [1, 2]}  \n', b"{}", b'{"x":{"y":"}"}}'):
            upstream.props = props
            got = c.get(url + "/props").content
            block = {"gpu_share": {"enabled": True, **SEED}}
            assert json.loads(got) == {**json.loads(props), "opencoti": block}
            added = (b", " if json.loads(props) else b"") + b'"opencoti": ' + json.dumps(block).encode()
            assert got.replace(added, b"", 1) == props  # every other byte as the engine sent it
        for props in (
            b"[1, 2]",
            b"not json",
            b'{"opencoti": {"mine": 1}}',
            b"[" * 100_000,
            b'{"a": "' + b"x" * 300_000 + b'"}',
        ):
            upstream.props = props
            assert c.get(url + "/props").content == props  # not an object, its own opencoti, too deep, too large
    assert len(seeded.calls) <= 3  # one read of the segment per PROXY_SEED_VIEW_MAX_AGE_S, shared


def test_without_a_seed_view_gpu_peers_and_props_go_to_the_engine(proxy, upstream) -> None:
    with httpx.Client() as c:
        assert c.get(f"http://127.0.0.1:{proxy.port}/gpu/peers").status_code == 404
        assert c.get(f"http://127.0.0.1:{proxy.port}/props").content == upstream.props


# -- the connection cap -------------------------------------------------------------------------------------


def test_at_the_cap_the_oldest_idle_connection_makes_room(upstream) -> None:
    with FrontProxy(("127.0.0.1", 0), ("127.0.0.1", upstream.port), max_connections=4) as p:
        idle = [socket.create_connection(("127.0.0.1", p.port), timeout=5) for _ in range(4)]
        try:
            wait_for(lambda: p.connections == 4, 5, what="4 connections")
            assert httpx.get(f"http://127.0.0.1:{p.port}/len", timeout=5).text == "hello"  # a 5th: room is made
            assert p.evicted_total == 1
            closed = select.select(idle, [], [], 5)[0]  # the oldest idle one went (readable: at its EOF)
            assert len(closed) == 1 and closed[0].recv(100) == b""
            assert p.connections <= 4
        finally:
            for s in idle:
                s.close()


def test_at_the_cap_with_every_connection_working_a_newcomer_waits_in_the_backlog(upstream) -> None:
    with FrontProxy(("127.0.0.1", 0), ("127.0.0.1", upstream.port), max_connections=2) as p:
        done: list[str] = []

        def stream() -> None:
            done.append(httpx.get(f"http://127.0.0.1:{p.port}/stream", timeout=30).text)

        threads = [threading.Thread(target=stream) for _ in range(2)]
        for t in threads:
            t.start()
        wait_for(lambda: p.in_flight == 2, 5, what="both streams in flight")
        late: list[str] = []
        t3 = threading.Thread(target=lambda: late.append(httpx.get(f"http://127.0.0.1:{p.port}/len", timeout=30).text))
        t3.start()
        time.sleep(0.5)
        assert late == [] and p.connections == 2 and p.evicted_total == 0  # waits: no working connection is cut
        upstream.release.set()
        for t in (*threads, t3):
            t.join(30)
        assert late == ["hello"] and len(done) == 2


def test_the_cap_keeps_fds_for_the_rest_of_the_process(monkeypatch) -> None:
    import resource

    from gpushare_tui.core.engines import front_proxy as fp

    monkeypatch.setattr(resource, "getrlimit", lambda _r: (1024, 4096))
    assert fp.connection_cap(512) == (1024 - fp.PROXY_FD_HEADROOM) // 2 < 512
    monkeypatch.setattr(resource, "getrlimit", lambda _r: (100_000, 100_000))
    assert fp.connection_cap(512) == 512


OUT_OF_FDS = """
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))  # filled fast
from gpushare_tui.core.engines.front_proxy import FrontProxy
p = FrontProxy(("127.0.0.1", 0), ("127.0.0.1", int(sys.argv[1]))).start()
print(p.port, flush=True)
sys.stdin.readline()
filler = []
try:
    while True:
        filler.append(os.open("/dev/null", os.O_RDONLY))
except OSError:  # EMFILE: no fd left for an accept
    pass
print("full", len(filler), flush=True)
sys.stdin.readline()
for fd in filler:
    os.close(fd)
print("freed", flush=True)
sys.stdin.readline()
print("errors", p.errors_total, flush=True)
"""


def test_out_of_fds_accept_backs_off_and_the_waiting_client_is_served_once_they_are_back(upstream, procs) -> None:
    """The proxy's process out of fds (another thread's): accept() fails with EMFILE while a client waits in the
    backlog. The loop backs off (no spin) and serves that client once fds are back."""
    import psutil

    p = procs.start([sys.executable, "-c", OUT_OF_FDS, str(upstream.port)], stdin=subprocess.PIPE)
    assert p.stdin is not None and p.stdout is not None
    port = int(p.stdout.readline())
    p.stdin.write("\n")
    p.stdin.flush()
    assert p.stdout.readline().startswith("full ")
    got: list[int] = []
    client = threading.Thread(
        target=lambda: got.append(httpx.get(f"http://127.0.0.1:{port}/len", timeout=30).status_code)
    )
    client.start()
    time.sleep(0.3)  # its connection waits in the backlog, each accept failing
    proc = psutil.Process(p.pid)
    proc.cpu_percent(None)
    cpu = proc.cpu_percent(interval=1.5)
    print(f"accepting out of fds: {cpu:.1f}% CPU over 1.5 s")
    assert cpu < 25.0 and got == []
    p.stdin.write("\n")
    p.stdin.flush()
    assert p.stdout.readline() == "freed\n"
    client.join(30)
    assert got == [200]
    p.stdin.write("\n")
    p.stdin.flush()
    assert p.stdout.readline() == "errors 0\n"  # EMFILE is no bug: nothing said


def test_a_head_that_drips_gets_408_and_a_silent_connection_is_closed(upstream, monkeypatch) -> None:
    from gpushare_tui.core.engines import front_proxy as fp

    monkeypatch.setattr(fp, "PROXY_HEAD_DEADLINE_S", 0.5)
    with FrontProxy(("127.0.0.1", 0), ("127.0.0.1", upstream.port)) as p:
        with socket.create_connection(("127.0.0.1", p.port), timeout=10) as s:
            t0 = time.monotonic()
            s.sendall(b"GET /len HT")
            assert _read_all(s).startswith(b"HTTP/1.1 408 ") and time.monotonic() - t0 < 5
        with socket.create_connection(("127.0.0.1", p.port), timeout=10) as s:
            assert _read_all(s) == b""  # nothing sent: closed quietly
        assert upstream.bodies == [] and p.in_flight == 0


def test_a_bug_in_one_connection_is_said_once_and_the_proxy_serves_on(upstream, monkeypatch) -> None:
    said: list[str] = []
    with FrontProxy(("127.0.0.1", 0), ("127.0.0.1", upstream.port), on_error=said.append) as p:
        real = p._exchange

        async def broken(cl, req):
            if req.target == b"/boom":
                raise KeyError("boom")
            return await real(cl, req)

        monkeypatch.setattr(p, "_exchange", broken)
        for _ in range(2):
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"http://127.0.0.1:{p.port}/boom", timeout=5)
        assert httpx.get(f"http://127.0.0.1:{p.port}/len", timeout=5).text == "hello"
    assert p.errors_total == 2 and len(said) == 1 and "KeyError" in said[0]


# -- the relay of a chunked reply as it came, against a hostile engine ---------------------------------------


def _raw_reply(proxy, upstream, pieces: list[bytes]) -> bytes:
    upstream.raw_body = pieces
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(b"GET /raw HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return _read_all(s)


def test_a_chunked_reply_split_anywhere_passes_unchanged(proxy, upstream) -> None:
    body = b"5;ext=1\r\nhello\r\n1a\r\n" + b"x" * 26 + b"\r\n0\r\n\r\n"
    for pieces in ([body], [bytes([b]) for b in body], [body[:3], body[3:9], body[9:]]):
        reply = _raw_reply(proxy, upstream, pieces)
        assert reply.split(b"\r\n\r\n", 1)[1] == body, pieces
    assert proxy.in_flight == 0


def test_trailers_pass_less_the_hop_by_hop_ones(proxy, upstream) -> None:
    body = b"3\r\nabc\r\n0\r\nX-Done: yes\r\nConnection: x-gone\r\nX-Gone: 1\r\n\r\n"
    reply = _raw_reply(proxy, upstream, [body])
    assert reply.endswith(b"3\r\nabc\r\n0\r\nX-Done: yes\r\n\r\n"), reply


@pytest.mark.parametrize(
    "bad",
    [
        b"zz\r\nhello\r\n",  # not a size
        b"5\r\nhelloXY",  # no CRLF after the data
        b"1" * 70_000,  # a size line over the budget
        b"0\r\n" + b"X-A: 1\r\n" * 10_000,  # trailers over the budget
        b"0\r\nno colon\r\n\r\n",  # a malformed trailer
        b"3\r\nabc\r\n",  # the engine closes before the last chunk
    ],
)
def test_an_engines_malformed_chunked_body_ends_the_clients_connection(proxy, upstream, bad) -> None:
    reply = _raw_reply(proxy, upstream, [b"2\r\nok\r\n", bad])
    assert reply.startswith(b"HTTP/1.1 200 ") and b"2\r\nok\r\n" in reply
    assert not reply.endswith(b"0\r\n\r\n")  # the client sees a cut reply, never a whole one
    wait_for(lambda: proxy.in_flight == 0, 5, what="no demand left")
    assert httpx.get(f"http://127.0.0.1:{proxy.port}/len", timeout=5).text == "hello"  # and serves on


_POST = b"POST /echo HTTP/1.1\r\nHost: x\r\n"
_CHUNKED_ABC = b"3\r\nabc\r\n0\r\n\r\n"


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (_POST + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n" + _CHUNKED_ABC, 400),
        (_POST + b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400),
        (_POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + _CHUNKED_ABC, 501),
        (b"GET /len HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
        (b"GET /len HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400),
        (b"GET /len HTTP/1.1\r\nHost: x\r\nX: a\r\n folded\r\n\r\n", 400),  # obs-fold
        (b"GET /len HTTP/1.1\nHost: x\n\n", 400),  # bare LF line ends
        (b"GET /len HTTP/1.1\r\nHost: x\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n", 431),  # whole, in one read
        (_POST + b"Connection: Upgrade\r\nUpgrade: h2c\r\nContent-Length: 3\r\n\r\nabc", 400),
        (_POST + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n" + b"X-T: 1\r\n" * 10_000 + b"\r\n", 431),
    ],
    ids=[
        "cl-and-te",
        "two-lengths",
        "te-not-chunked",
        "no-host",
        "two-hosts",
        "obs-fold",
        "bare-lf",
        "head-over-budget",
        "upgrade-with-body",
        "trailers-over-budget",
    ],
)
def test_a_request_the_parser_refuses_gets_its_status_and_reaches_no_engine(proxy, upstream, request_bytes, status):
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
        s.sendall(request_bytes)
        reply = _read_all(s)
    assert reply.startswith(b"HTTP/1.1 %d " % status) and b"Connection: close\r\n" in reply, reply[:120]
    # a chunked body streams to the engine as it comes: where the request came in several reads (a loaded box; a
    # new connection's first read takes at most PROXY_PIPELINE_BUFFER_BYTES), its head went on before its trailers
    # broke the budget; that engine connection is closed then, before the request's end (this engine, as an
    # engine does, answers a request once it has ended: it records none), and no DEMAND rose
    assert upstream.bodies == [] and proxy.in_flight == 0 and proxy.changes == []


def test_trailers_over_budget_after_the_head_went_on_get_431_and_the_engine_no_request(proxy, upstream) -> None:
    """A chunked request whose head and data went on to the engine (they came first) and whose trailers then
    break the head budget: 431 to the client, the engine connection closed before the request's end (the engine
    never answers it), no DEMAND. (The test origin answered a chunked request at its head before: its early 200
    reached the client first on a loaded box, in the whole suite beside a CPU hog.)"""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
        s.sendall(_POST + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n")
        wait_for(lambda: upstream.connections >= 1, 5, what="the head sent on")
        s.sendall(b"X-T: 1\r\n" * 10_000 + b"\r\n")
        reply = _read_all(s)
    assert reply.startswith(b"HTTP/1.1 431 ") and b"Connection: close\r\n" in reply, reply[:120]
    wait_for(lambda: upstream.ended == upstream.connections, 5, what="the engine connection closed")
    assert upstream.bodies == [] and proxy.in_flight == 0 and proxy.changes == []


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",  # bare LF line ends
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nX: a\r\n folded\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * (MAX_HEAD_BYTES + 10),  # never ends, over the budget
        # over the budget with its end, in one write: the loop may read it whole (the budget holds then too)
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-",  # the engine closes inside its head
    ],
    ids=[
        "bare-lf",
        "cl-and-te",
        "te-not-chunked",
        "two-lengths",
        "obs-fold",
        "over-budget",
        "over-budget-whole",
        "cut",
    ],
)
def test_an_engines_malformed_head_gets_502_and_the_proxy_serves_on(proxy, upstream, head) -> None:
    upstream.raw_head = head
    with httpx.Client() as c:
        r = c.get(f"http://127.0.0.1:{proxy.port}/head", timeout=5)
        assert r.status_code == 502 and r.json()["error"].startswith("engine"), (r.status_code, r.content[:200])
        assert c.get(f"http://127.0.0.1:{proxy.port}/len", timeout=5).text == "hello"
    assert proxy.in_flight == 0


@pytest.mark.parametrize(
    "request_bytes, head, body",
    [
        (
            b"GET /stream HTTP/1.0\r\n\r\n",
            b"Connection: close",
            b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n",
        ),
        (
            b"GET /eof HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"Transfer-Encoding: chunked",
            b"d\r\nuntil the end\r\n0\r\n\r\n",
        ),
        (b"GET /eof HTTP/1.0\r\n\r\n", b"Connection: close", b"until the end"),
        (b"HEAD /len HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", b"Content-Length: 5", b""),
    ],
    ids=["chunked-to-1.0", "close-delimited-to-1.1", "close-delimited-to-1.0", "head"],
)
def test_each_client_gets_the_framing_it_reads(proxy, upstream, request_bytes, head, body) -> None:
    """A reply of unknown length is chunked to an HTTP/1.1 client and delimited by closing to HTTP/1.0 (with
    Connection: close); a HEAD reply has no body."""
    upstream.release.set()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(request_bytes)
        got_head, got_body = _read_all(s).split(b"\r\n\r\n", 1)
    assert got_head.startswith(b"HTTP/1.1 200 ") and head in got_head.split(b"\r\n"), got_head
    assert got_body == body


def test_bytes_after_a_reply_are_not_taken_for_the_next_one(proxy, upstream) -> None:
    with httpx.Client() as c:
        upstream.raw_body = [b"2\r\nok\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil"]
        assert c.get(f"http://127.0.0.1:{proxy.port}/raw").text == "ok"
        assert c.get(f"http://127.0.0.1:{proxy.port}/len").text == "hello"  # a new engine connection


# -- an engine that is still loading -----------------------------------------------------------------------


def test_requests_wait_for_a_loading_engine_and_health_says_loading(upstream) -> None:
    with FrontProxy(("127.0.0.1", 0), ("127.0.0.1", upstream.port), engine_ready=False) as p:
        url = f"http://127.0.0.1:{p.port}"
        health = httpx.get(url + "/health", timeout=5)
        assert health.status_code == 503 and health.json()["error"]["message"] == "Loading model"
        got: list[str] = []
        t = threading.Thread(target=lambda: got.append(httpx.get(url + "/len", timeout=30).text))
        t.start()
        time.sleep(0.5)
        assert got == [] and upstream.bodies == []  # waits: nothing sent to the engine yet
        p.set_engine_ready()
        t.join(10)
        assert got == ["hello"] and httpx.get(url + "/health", timeout=5).status_code == 404  # the engine's own


def test_a_request_waits_at_most_its_budget_for_the_engine(upstream) -> None:
    with FrontProxy(("127.0.0.1", 0), ("127.0.0.1", upstream.port), engine_ready=False, engine_wait_s=0.5) as p:
        t0 = time.monotonic()
        r = httpx.get(f"http://127.0.0.1:{p.port}/len", timeout=10)
        assert r.status_code == 503 and "still loading" in r.json()["error"] and time.monotonic() - t0 < 5
        with socket.create_connection(("127.0.0.1", p.port), timeout=10) as s:  # one that leaves while it waits
            s.sendall(b"GET /len HTTP/1.1\r\nHost: x\r\n\r\n")
            wait_for(lambda: p.connections == 1, 5, what="the waiting connection")
        wait_for(lambda: p.connections == 0, 5, what="the connection freed when its client left")


def test_a_socket_handed_down_is_served_and_left_listening_for_the_next(upstream) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    for _ in range(2):  # a restart: the next proxy serves the same socket
        with FrontProxy(
            ("127.0.0.1", 0), ("127.0.0.1", upstream.port), sock=socket.socket(fileno=os.dup(listener.fileno()))
        ) as p:
            assert p.port == port and httpx.get(f"http://127.0.0.1:{port}/len", timeout=5).text == "hello"
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # not refused between the two: it waits
            pass
    listener.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chunks=st.lists(st.binary(min_size=1, max_size=300), max_size=6),
    cuts=st.lists(st.integers(min_value=1, max_value=40), max_size=12),
    ext=st.booleans(),
)
def test_any_chunked_body_cut_anywhere_comes_as_it_was_sent(proxy, upstream, chunks, cuts, ext) -> None:
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(c), b";e=1" if ext else b"", c) for c in chunks) + b"0\r\n\r\n"
    pieces, i = [], 0
    for n in cuts:
        if i < len(body):
            pieces.append(body[i : i + n])
            i += n
    pieces.append(body[i:])
    reply = _raw_reply(proxy, upstream, [p for p in pieces if p])
    assert reply.split(b"\r\n\r\n", 1)[1] == body


# -- the proxy in a process of its own (core/engines/proxy_process.py, as the supervisor runs it) ------------


def test_the_proxy_process_serves_says_demand_and_comes_back_after_a_kill(upstream) -> None:
    from gpushare_tui.core.engines.proxy_process import ProxyProcess

    changes: list[bool] = []
    said: list[str] = []
    views: list[int] = []

    def view() -> dict:
        views.append(1)
        return {"gpu_key": "k", "self": None, "peers": []}

    p = ProxyProcess(
        ("127.0.0.1", 0), ("127.0.0.1", upstream.port), on_demand=changes.append, on_error=said.append,
        seed_view=view, engine_ready=False,
    ).start()  # fmt: skip
    try:
        url = f"http://127.0.0.1:{p.port}"
        assert httpx.get(url + "/health", timeout=5).status_code == 503  # loading
        p.set_engine_ready()
        assert httpx.get(url + "/len", timeout=5).text == "hello"
        wait_for(lambda: changes == [True, False], 5, what=f"demand up and down, not {changes}")
        assert httpx.get(url + "/gpu/peers", timeout=5).json()["gpu_key"] == "k" and views
        assert p.proc is not None
        first = p.proc.pid
        os.kill(first, 9)
        wait_for(lambda: p.proc is not None and p.proc.pid != first, 10, what="the proxy process started again")
        r = httpx.get(url + "/len", timeout=10)
        assert r.text == "hello", said  # the socket kept: the port serves again
        assert any("exited" in x and "starting it again" in x for x in said), said
    finally:
        p.close()
    assert p.proc is not None and p.proc.poll() is not None  # none left


def test_clients_that_all_send_at_once_are_each_answered_as_a_kept_alive_one_is(proxy, upstream) -> None:
    """New connections are taken PROXY_ACCEPTS_PER_WAKE at a wake of the listening socket (each request whole in
    its first bytes sent on from its accept): a burst of 96 is answered whole, over several wakes, and a client
    already connected is served meanwhile."""
    request = b"GET /len HTTP/1.1\r\nHost: x\r\n\r\n"
    socks = []
    try:
        with httpx.Client() as kept:
            assert kept.get(f"http://127.0.0.1:{proxy.port}/len").text == "hello"
            for _ in range(96):  # connected and sent before the proxy's loop takes any of them
                s = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
                s.sendall(request)
                socks.append(s)
            assert kept.get(f"http://127.0.0.1:{proxy.port}/len").text == "hello"
        for s in socks:
            reply = b""
            while not reply.endswith(b"hello"):
                data = s.recv(65536)
                assert data, reply
                reply += data
            assert reply.startswith(b"HTTP/1.1 200 "), reply
    finally:
        for s in socks:
            s.close()
    assert proxy.requests_total == 98
