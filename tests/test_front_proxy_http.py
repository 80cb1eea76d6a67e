"""core/engines/front_proxy.py against a real llama-server (issue 26): pipelining after a chunked body, `Expect:
100-continue`, a body that never comes (no DEMAND, cut after the body-idle budget), a reply that takes longer
than every budget of the proxy's, HTTP/1.0, a refused upgrade, a half-close, a connection's first bytes read
before its socket is the loop's (clients that reset at once, a bad head answered whole), and the same replies
through the proxy as direct for any byte stream (hypothesis)."""

from __future__ import annotations

import http.client
import io
import json
import os
import signal
import socket
import struct
import subprocess
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare_tui.core.engines.front_proxy import FrontProxy
from gpushare_tui.core.engines.llama_server import free_port
from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS
from testkit.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.llama]


@pytest.fixture(scope="module")
def engine(llama_server, tiny_model):
    """One llama-server for the module (--timeout 1: its own socket timeout, far below the waits tested)."""
    port = free_port()
    argv = [llama_server, "-m", tiny_model, "-t", "1", "-c", "2048", "-np", "2", "--timeout", "1"]
    proc = subprocess.Popen(
        [*argv, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: _healthy(port), 60, what="llama-server health")
        yield proc, port
    finally:
        for sig in (signal.SIGCONT, signal.SIGKILL):  # never left stopped
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
        proc.wait()


@pytest.fixture
def proxy(engine):
    changes: list[bool] = []
    # body_idle_s above the engine's --timeout (1 s): the engine's own 400 must come first where it has one.
    p = FrontProxy(
        ("127.0.0.1", 0), ("127.0.0.1", engine[1]), on_demand=changes.append, idle_keepalive_s=0.5, body_idle_s=3.0
    ).start()
    p.changes = changes  # type: ignore[attr-defined]
    yield p
    p.close()
    assert p.errors_total == 0  # no connection ended by a bug (a client's retry would hide it)


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class _File:
    """What http.client.HTTPResponse reads pipelined replies from: one buffered file for all of them (a
    reply's end closes its file: this one stays open)."""

    def __init__(self, f: io.BufferedReader) -> None:
        self.f = f

    def makefile(self, _mode: str) -> _File:
        return self

    def __getattr__(self, name: str):
        return getattr(self.f, name)

    def close(self) -> None:
        pass


def replies(port: int, parts: list[bytes], methods: list[str], timeout_s: float = 30) -> list[tuple[int, bytes]]:
    """Send `parts` (one write each) on one connection, then read a reply per request of `methods`:
    (status, body) for each that came before the connection closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        for part in parts:
            s.sendall(part)
        f = s.makefile("rb")
        out = []
        for method in methods:
            r = http.client.HTTPResponse(_File(f), method=method)  # type: ignore[arg-type]
            try:
                r.begin()
                body = r.read()
            except (http.client.RemoteDisconnected, http.client.IncompleteRead, ConnectionError):
                break
            out.append((r.status, body))
            if r.will_close:
                break
        return out


def chunked(body: bytes, sizes: list[int]) -> bytes:
    out, i = b"", 0
    for n in sizes:
        if i >= len(body):
            break
        piece = body[i : i + max(1, n)]
        out += b"%x\r\n%s\r\n" % (len(piece), piece)
        i += len(piece)
    if i < len(body):
        out += b"%x\r\n%s\r\n" % (len(body) - i, body[i:])
    return out + b"0\r\n\r\n"


def tokenize(text: str, *, chunks: list[int] | None = None, expect: bool = False) -> bytes:
    body = json.dumps({"content": text}).encode()
    head = b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += b"Expect: 100-continue\r\n" if expect else b""
    if chunks is None:
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(body, chunks)


HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


# -- the reported cases ----------------------------------------------------------------------------------


def test_a_get_pipelined_after_a_chunked_post_gets_its_reply(engine, proxy) -> None:
    """Issue 26, finding 2: 0 replies through the proxy, 2 direct."""
    stream = tokenize("hello world", chunks=[3, 4]) + HEALTH
    direct = replies(engine[1], [stream], ["POST", "GET"])
    via = replies(proxy.port, [stream], ["POST", "GET"])
    assert [s for s, _ in direct] == [200, 200] and via == direct


def test_expect_100_continue_is_relayed_before_the_body_is_sent(engine, proxy) -> None:
    """Finding 3: the engine's 100 Continue reaches the client at once (it came direct, not through)."""
    request = tokenize("hello", expect=True)
    head, body = request.split(b"\r\n\r\n", 1)
    for port in (engine[1], proxy.port):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(head + b"\r\n\r\n")
            s.settimeout(5)
            f = s.makefile("rb")
            first = f.readline()  # the 100's head may come in more than one segment: read it to its blank line
            assert first.startswith(b"HTTP/1.1 100 "), (port, first)
            while f.readline() not in (b"\r\n", b"\n", b""):
                pass
            s.sendall(body)
            r = http.client.HTTPResponse(_File(f), method="POST")  # type: ignore[arg-type]
            r.begin()
            assert r.status == 200 and b"tokens" in r.read()


def test_a_body_that_never_comes_holds_no_demand_and_is_cut_after_its_budget(engine, proxy) -> None:
    """Finding 4: a POST announcing a body and sending none held DEMAND as long as its socket stayed open.
    Before llama-server (its --timeout, 1 s here, answers 400) and before an engine that never times out
    (a listener that reads nothing: the proxy's body-idle budget answers 408)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        mute = FrontProxy(("127.0.0.1", 0), silent.getsockname(), body_idle_s=0.5).start()
        try:
            for p, status in ((proxy, b"400"), (mute, b"408")):
                with socket.create_connection(("127.0.0.1", p.port), timeout=10) as s:
                    t0 = time.monotonic()
                    s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
                    time.sleep(0.2)
                    assert p.in_flight == 0 and not p.demand_changes
                    reply = _read_all(s)
                    waited = time.monotonic() - t0
                assert reply.startswith(b"HTTP/1.1 " + status + b" "), reply[:100]
                assert waited < 6, waited
                assert not p.demand_changes and p.in_flight == 0
                wait_for(lambda p=p: p.connections == 0, 5, what="the connection to end")
            assert 0.5 <= waited, waited  # the proxy's own budget
        finally:
            mute.close()
    assert replies(proxy.port, [HEALTH], ["GET"]) == replies(engine[1], [HEALTH], ["GET"])


def test_a_reply_slower_than_every_proxy_budget_and_the_engines_timeout_arrives(engine, proxy) -> None:
    """Finding 1 (a non-streamed reply cut at the 60 s idle limit), on a clock 100 times faster: the proxy's
    idle limit is 0.5 s here, llama-server's --timeout 1 s, and the engine is stopped (as pacing stops it)
    for 3 s mid-completion. The reply comes, as it does direct: the wait is bounded by neither."""
    proc, port = engine
    body = {"prompt": "the", "n_predict": 8, "ignore_eos": True, "temperature": 0, "seed": 1, "cache_prompt": False}
    body["logit_bias"] = [[t, False] for t in NON_TEXT_TOKEN_IDS]
    got: dict[str, tuple[int, str, float]] = {}

    def ask(name: str, to: int) -> None:
        t0 = time.monotonic()
        r = httpx.post(f"http://127.0.0.1:{to}/completion", json=body, timeout=60)
        got[name] = (r.status_code, r.json()["content"], time.monotonic() - t0)

    for name, to in (("direct", port), ("proxy", proxy.port)):
        t = threading.Thread(target=ask, args=(name, to))
        proc.send_signal(signal.SIGSTOP)
        try:
            t.start()
            if name == "proxy":
                wait_for(lambda: proxy.in_flight == 1, 5, what="the request in flight")
            time.sleep(3.0)
        finally:
            proc.send_signal(signal.SIGCONT)
        t.join(60)
    assert got["proxy"][:2] == got["direct"][:2] and got["proxy"][0] == 200, got
    assert got["proxy"][2] >= 2.5 and got["direct"][2] >= 2.5, got  # the engine was stopped for 3 s of it
    wait_for(lambda: proxy.changes == [True, False], 5, what="DEMAND to fall at the reply's end")


def test_http_10_upgrade_and_half_close(engine, proxy) -> None:
    for port in (engine[1], proxy.port):
        one_o = replies(port, [b"GET /health HTTP/1.0\r\n\r\n"], ["GET"])
        assert [s for s, _ in one_o] == [200], (port, one_o)
    upgrade = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    via = replies(proxy.port, [upgrade, HEALTH], ["GET", "GET"])
    assert [s for s, _ in via] == [200, 200]  # answered as a plain request: not switched, still HTTP
    for port in (engine[1], proxy.port):  # printf 'GET ...' | nc: the request, then EOF
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            s.shutdown(socket.SHUT_WR)
            assert _read_all(s).startswith(b"HTTP/1.1 200 "), port


def test_a_client_leaving_during_the_wait_ends_demand_and_the_engine_connection(engine, proxy) -> None:
    body = json.dumps({"prompt": "the", "n_predict": 400, "ignore_eos": True, "cache_prompt": False}).encode()
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    wait_for(lambda: proxy.in_flight == 1, 5, what="the request in flight")
    s.close()
    wait_for(lambda: proxy.in_flight == 0 and proxy.connections == 0, 10, what="the request to end with its client")
    wait_for(lambda: proxy.changes == [True, False], 5, what="DEMAND to fall")


# -- a connection's first bytes, read before the loop makes the socket its transport ----------------------


def test_clients_that_reset_as_they_send_their_request_leave_no_connection_demand_or_fd(engine, proxy) -> None:
    """A request whole in a new connection's first bytes goes to the engine before the socket is the loop's
    transport: clients that reset (RST) right after sending, some before the proxy read them and some after,
    end their own exchanges only."""
    body = json.dumps({"prompt": "the", "n_predict": 32, "stream": True, "cache_prompt": False}).encode()
    request = _post(b"/completion", body)
    fds_before = len(os.listdir("/proc/self/fd"))
    for i in range(40):
        s = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() resets
        s.sendall(request)
        if i % 2:
            time.sleep(0.005)  # read, maybe sent on, by now
        s.close()
    wait_for(lambda: proxy.in_flight == 0 and proxy.connections == 0, 20, what="every exchange to end")
    wait_for(lambda: bool(proxy.changes) and proxy.changes[-1] is False, 5, what="DEMAND to fall")
    wait_for(lambda: len(os.listdir("/proc/self/fd")) <= fds_before + 2, 10, what="the proxy's fds to be closed")
    via = replies(proxy.port, [HEALTH, request], ["GET", "POST"])
    assert [status for status, _ in via] == [200, 200], via


@pytest.mark.parametrize(
    "bad",
    [
        b"GET /health HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
        b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"GET /health HTTP/1.1\nHost: x\n\n",
        HEALTH + b"GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
    ],
)
def test_a_bad_head_in_a_connections_first_bytes_is_answered_whole_before_the_close(proxy, bad: bytes) -> None:
    """Its answer is written before the socket is the loop's transport, and sent before the close."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(bad)
        got = _read_all(s)
    statuses, body = [], b""
    while got:  # each reply: its head, then a body of its Content-Length
        head, _, got = got.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = int(next(v for n, _, v in (h.partition(b": ") for h in lines) if n == b"Content-Length"))
        statuses.append(lines[0][9:12])
        body, got = got[:length], got[length:]
    # (a bad head after a good one was closed on, unanswered, while the first reply's state stood)
    assert statuses == [b"200"] * bad.count(HEALTH) + [b"501" if b"gzip" in bad else b"400"], statuses
    assert json.loads(body)["error"], body


# -- any byte stream: the same replies through the proxy as direct ----------------------------------------

_texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
_request = st.one_of(
    st.just(("GET", HEALTH)),
    st.just(("GET", b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")),
    st.builds(lambda t: ("POST", tokenize(t)), _texts),
    st.builds(lambda t, c: ("POST", tokenize(t, chunks=c)), _texts, st.lists(st.integers(1, 9), max_size=6)),
    st.builds(
        lambda ids: ("POST", _post(b"/detokenize", json.dumps({"tokens": ids}).encode())),
        st.lists(st.integers(0, 30), max_size=8),
    ),
)


def _post(path: bytes, body: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path, len(body), body)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(_request, min_size=1, max_size=4), cuts=st.lists(st.integers(1, 200), max_size=6))
def test_any_pipelined_byte_stream_gets_the_replies_it_gets_direct(engine, proxy, requests, cuts) -> None:
    stream = b"".join(r for _m, r in requests)
    parts, i = [], 0
    for n in cuts:  # split writes anywhere: inside heads, chunk-size lines, bodies
        parts.append(stream[i : i + n])
        i += n
    parts.append(stream[i:])
    methods = [m for m, _r in requests]
    direct = replies(engine[1], [p for p in parts if p], methods)
    via = replies(proxy.port, [p for p in parts if p], methods)
    # every reply direct gave, the same and in order; llama-server closes its connection after a 404, and
    # what it then leaves unanswered the proxy answers on a new engine connection (Connection is hop-by-hop)
    assert via[: len(direct)] == direct and len(via) == len(requests), (direct, via)


def _read_all(s: socket.socket) -> bytes:
    out = b""
    while data := s.recv(65536):
        out += data
    return out
