"""The front proxy's C relay (core/engines/_relay.c): a streamed reply goes to it after its first token, and comes
back to the loop at its last chunk, at framing it does not relay, or at an end. Its contract: what it relays plus
what it gives back is what it read, byte for byte, however the engine's writes were cut; a client sees the same
bytes through it as through the loop alone, whatever a hostile engine sends; a client that stops reading holds a
bounded amount of the proxy's memory; a client that leaves ends the engine's connection; every socket it took
is given back."""

from __future__ import annotations

import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare_tui.core.engines import front_proxy as fp
from gpushare_tui.core.host.budgets import (
    LATENCY_FIRST_TOKEN_SCAN_MAX_BYTES,
    PROXY_MAX_HEAD_BYTES,
    PROXY_RELAY_HOLD_MAX_BYTES,
    PROXY_RELAY_OUT_MAX_BYTES,
)
from gpushare_tui.core.host.sockets import free_port
from gpushare_tui.core.observe.latency import NOT_TOKENS
from testkit.engines import engine_command
from testkit.wait import wait_for


def test_the_c_relay_is_built_from_its_source_where_a_compiler_is() -> None:
    """setup.py builds it at install (optional: a box without a C compiler relays on the loop); an edit of the
    source without a reinstall would test the old build."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: the proxy relays on the loop")
    assert fp._relay is not None, "the C relay was not built: pip install -e ."
    for name in ("_relay.c", "picohttpparser.c", "picohttpparser.h"):
        source = Path(fp.__file__).with_name(name)
        assert Path(fp._relay.__file__).stat().st_mtime >= source.stat().st_mtime, f"{name} changed: pip install -e ."


_relay = pytest.importorskip("gpushare_tui.core.engines._relay", reason="the C relay is not built here")

EVENT = b'data: {"content":" the"}\n\n'


def _chunk(data: bytes, size: bytes | None = None) -> bytes:
    return (size if size is not None else b"%x" % len(data)) + b"\r\n" + data + b"\r\n"


# -- the Relayer alone, on socket pairs --------------------------------------------------------------------------


class _Pairs:
    """A Relayer relaying from `engine` (our end: we write) to `client` (our end: we read); `up` is the loop's
    end of the engine's connection (the relayer has its own copy until the stream ends there)."""

    def __init__(self, relayer: _relay.Relayer, efd: int, timed: bool = True, hold_max: int = -1) -> None:
        self.relayer, self.efd = relayer, efd
        self.engine, self.up = socket.socketpair()
        to_client, self.client = socket.socketpair()
        self.token = relayer.start(self.up.fileno(), to_client.fileno(), timed, hold_max)
        to_client.close()
        self.times: list[float] = []
        self.held: list[tuple[float, int, bytes]] = []

    def _collect(self) -> tuple | None:
        """One wait on the eventfd (at most 50 ms) and a collect: this stream's times and held reads added; its
        report where it ended."""
        select.select([self.efd], [], [], 0.05)
        try:
            os.eventfd_read(self.efd)
        except BlockingIOError:
            pass
        for r in self.relayer.collect():
            if r[0] == self.token:
                self.times += r[7]
                self.held += r[10]
                if r[1] != _relay.LIVE:
                    return r
        return None

    def report(self, timeout_s: float = 5.0) -> tuple | None:
        """The stream's final report, once it ended in the relayer (None: still relaying at the timeout)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if (r := self._collect()) is not None:
                return r
        return None

    def held_now(self, n: int, timeout_s: float = 5.0) -> list[tuple[float, int, bytes]]:
        """The reads held, once there are `n` of them (the relayer tells of them within its flush time)."""
        end = time.monotonic() + timeout_s
        while len(self.held) < n and time.monotonic() < end:
            self._collect()
        return self.held

    def received(self) -> bytes:
        return _drain(self.client)

    def close(self) -> None:
        for s in (self.engine, self.up, self.client):
            s.close()


def _drain(s: socket.socket) -> bytes:
    """What `s` holds now (up to its EOF)."""
    s.setblocking(False)
    out = b""
    while True:
        try:
            data = s.recv(1 << 20)
        except BlockingIOError:
            return out
        if not data:
            return out
        out += data


@pytest.fixture
def relayer() -> Iterator[tuple[_relay.Relayer, int]]:
    efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    r = _relay.Relayer(efd, NOT_TOKENS, PROXY_RELAY_OUT_MAX_BYTES, 0.05)
    yield r, efd
    r.close()
    os.close(efd)


def _stream(n_events: int = 6, tail: bytes = b"0\r\nx-t: 1\r\n\r\n") -> bytes:
    return b"".join(_chunk(b'data: {"content":"%d"}\n\n' % i) for i in range(n_events)) + tail


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=12),
    odd=st.sampled_from(
        [
            b"0\r\nx-t: 1\r\n\r\n",
            b"A\r\n0123456789\r\n0\r\n\r\n",
            b"0\r\n\r\nafter",
            b"5;e=1\r\nhello\r\n",
            b"00a\r\n",
            b"zz\r\n",
            b"5\r\nhelloXX",
            b"1234567890abcdef1\r\n",
            b"\r\n",
            b"5\n\r\nhello\r\n",
        ]
    ),  # fmt: skip
)
def test_what_it_relays_and_gives_back_is_what_it_read(relayer, cuts: list[int], odd: bytes) -> None:
    """However the engine's writes are cut, the client gets a prefix of the stream, the report gives back what was
    read and not relayed, and the loop reads the rest from the socket: together, the stream. The stop is at the
    last chunk with trailers (LAST) or the first element it does not relay (ODD), never inside a size line; a last
    chunk without trailers is relayed and ends the reply there (DONE)."""
    data = _stream(tail=odd)
    pairs = _Pairs(*relayer)
    try:
        at = 0
        for cut in sorted(set(c for c in cuts if c < len(data))) + [len(data)]:
            pairs.engine.sendall(data[at:cut])
            at = cut
            time.sleep(0.001)
        pairs.engine.shutdown(socket.SHUT_WR)
        report = pairs.report()
        assert report is not None, "the stream did not end in the relayer"
        _tok, reason, _err, _state, _left, out, rest, *_ = report
        got = pairs.received() + out
        assert got + rest + _drain(pairs.up) == data, (got, rest)
        if odd.startswith(b"0\r\n\r\n"):  # a last chunk without trailers
            assert reason == _relay.DONE and got == data[: len(_stream(tail=b"0\r\n\r\n"))], (got, rest)
            return
        assert reason in (_relay.LAST, _relay.ODD)
        stop = len(_stream(tail=b""))  # where the odd or last element begins: all before it relayed, nothing after
        assert got == data[: len(got)] and (reason == _relay.ODD and odd == b"5\r\nhelloXX" or len(got) == stop)
        if odd.startswith(b"0\r\n"):
            assert reason == _relay.LAST
    finally:
        pairs.close()


def test_an_engine_eof_mid_chunk_gives_back_where_it_stopped(relayer) -> None:
    pairs = _Pairs(*relayer)
    try:
        pairs.engine.sendall(_chunk(EVENT) + b"1a\r\ndata: {")
        time.sleep(0.05)
        pairs.engine.shutdown(socket.SHUT_WR)
        report = pairs.report()
        assert report is not None
        _tok, reason, _err, state, left, out, rest, *_ = report
        assert reason == _relay.EOF and state == _relay.IN_DATA and left == 0x1A - len(b"data: {")
        assert pairs.received() + out == _chunk(EVENT) + b"1a\r\ndata: {" and rest == b""
    finally:
        pairs.close()


def test_a_size_line_cut_at_the_eof_is_given_back_whole(relayer) -> None:
    pairs = _Pairs(*relayer)
    try:
        pairs.engine.sendall(_chunk(EVENT) + b"1")
        time.sleep(0.05)
        pairs.engine.sendall(b"a\r")
        time.sleep(0.05)
        pairs.engine.shutdown(socket.SHUT_WR)
        report = pairs.report()
        assert report is not None
        assert report[1] == _relay.EOF and report[3] == _relay.IN_SIZE and report[6] == b"1a\r"
        assert pairs.received() == _chunk(EVENT)
    finally:
        pairs.close()


def test_tokens_are_timed_by_their_reads_and_pings_are_not(relayer) -> None:
    """One time per read that begins with a token's event; an SSE comment, `data: [DONE]` and the last chunk
    are none (the loop's recorder reads them so: NOT_TOKENS)."""
    pairs = _Pairs(*relayer)
    try:
        writes = [_chunk(EVENT), _chunk(b": ping\n\n"), _chunk(EVENT), _chunk(b"data: [DONE]\n\n"), b"0\r\n\r\n"]
        before = time.monotonic()
        for w in writes:
            pairs.engine.sendall(w)
            time.sleep(0.02)  # a read each
        report = pairs.report()
        assert report is not None and report[1] == _relay.DONE
        assert len(pairs.times) == 2 and before <= pairs.times[0] < pairs.times[1] <= time.monotonic()
        assert pairs.received() == b"".join(writes)  # its last chunk too: the reply ended there
    finally:
        pairs.close()


def test_reads_are_held_for_the_loop_until_it_has_found_the_first_token(relayer) -> None:
    """Relayed at once and held, each with its time and where its event begins, up to the first that may be a
    token; `seen` without found lets holding begin again, with found it ends (reads are timed from then on)."""
    r, _efd = relayer
    pairs = _Pairs(*relayer, hold_max=PROXY_RELAY_HOLD_MAX_BYTES)
    try:
        ping, role = _chunk(b": ping\n\n"), _chunk(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n')
        before = time.monotonic()
        pairs.engine.sendall(ping)
        time.sleep(0.02)
        pairs.engine.sendall(role)
        held = pairs.held_now(2)
        assert [(at, data) for _t, at, data in held] == [(ping.index(b":"), ping), (role.index(b"data:"), role)]
        assert before <= held[0][0] < held[1][0] <= time.monotonic()
        assert pairs.received() == ping + role  # relayed, not waiting for the loop
        assert r.seen(pairs.token, False) == ()  # not found: holding begins again
        pairs.engine.sendall(_chunk(EVENT))
        held = pairs.held_now(3)
        assert held[2][2] == _chunk(EVENT) and not pairs.times
        assert r.seen(pairs.token, True) == ()  # found: reads are timed, no longer held
        pairs.engine.sendall(_chunk(EVENT))
        time.sleep(0.05)
        pairs.engine.sendall(b"0\r\n\r\n")
        report = pairs.report()
        assert report is not None and report[1] == _relay.DONE
        assert len(pairs.held) == 3 and len(pairs.times) == 1 and pairs.times[0] > held[2][0]
        assert pairs.received() == _chunk(EVENT) * 2 + b"0\r\n\r\n"
    finally:
        pairs.close()


def test_reads_after_one_that_may_be_the_first_token_are_timed_and_kept_aside(relayer) -> None:
    """The reads after the first that may be a token are timed as tokens and kept aside: dropped when the loop
    found the token, given to it (their times forgotten) when it did not."""
    r, _efd = relayer
    for found in (True, False):
        pairs = _Pairs(*relayer, hold_max=PROXY_RELAY_HOLD_MAX_BYTES)
        try:
            role = _chunk(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n')
            for w in (role, _chunk(EVENT), _chunk(EVENT)):
                pairs.engine.sendall(w)
                time.sleep(0.02)
            held = pairs.held_now(1)
            assert [data for _t, _at, data in held] == [role] and len(pairs.times) == 2, found
            aside = r.seen(pairs.token, found)
            assert [data for _t, _at, data in aside] == ([] if found else [_chunk(EVENT)] * 2)
            if not found:
                assert [t for t, _at, _d in aside] == pairs.times  # the same reads: their times are forgotten
            pairs.engine.sendall(b"0\r\n\r\n")
            report = pairs.report()
            assert report is not None and report[1] == _relay.DONE and report[7] == ()
        finally:
            pairs.close()


def test_a_stream_that_ends_before_the_loop_says_still_gives_its_last_report(relayer) -> None:
    """The loop looks at a report's held reads while the stream goes on: if it ends meanwhile, the loop's `seen`
    does not forget it; its last report (the end, what it left) is still collected (a stream whose end the loop
    never heard of would never end for its client's next request)."""
    r, _efd = relayer
    role = _chunk(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n')
    for found in (True, False):
        pairs = _Pairs(*relayer, hold_max=PROXY_RELAY_HOLD_MAX_BYTES)
        try:
            pairs.engine.sendall(role)
            assert [data for _t, _at, data in pairs.held_now(1)] == [role]
            pairs.engine.sendall(_chunk(EVENT) + b"0\r\n\r\n")  # it ends before the loop's word
            wait_for(lambda p=pairs: p.received().endswith(b"0\r\n\r\n"), 5, what="the stream's end relayed")
            r.seen(pairs.token, found)
            report = pairs.report()
            assert report is not None and report[1] == _relay.DONE, found
        finally:
            pairs.close()


def test_reads_held_past_the_budget_wait_for_the_loop_to_look(relayer) -> None:
    """Reads held above `hold_max` bytes pause the engine's reading (what the relay keeps for the loop is bounded:
    it is told at half of it); the loop's `seen` resumes it."""
    r, _efd = relayer
    pairs = _Pairs(*relayer, hold_max=64)
    try:
        for _ in range(3):  # over 64 bytes held in the first two reads: the third waits in the socket
            pairs.engine.sendall(_chunk(EVENT))
            time.sleep(0.05)
        assert pairs.received() == _chunk(EVENT) * 2
        reports = r.collect()  # the first read, held; the second kept aside: the relay waits for the loop's word
        assert [data for _t, _at, data in reports[0][10]] == [_chunk(EVENT)] and len(reports[0][7]) == 1
        time.sleep(0.05)
        assert pairs.received() == b""
        assert r.seen(pairs.token, True) == ()
        time.sleep(0.05)
        assert pairs.received() == _chunk(EVENT)
    finally:
        pairs.close()


def test_a_client_that_leaves_ends_the_stream_and_its_sockets_are_given_back(relayer) -> None:
    sockets = _sockets()
    pairs = _Pairs(*relayer)
    try:
        pairs.engine.sendall(_chunk(EVENT))
        time.sleep(0.05)
        pairs.client.close()
        for _ in range(50):  # until a write fails (the first may be taken by the closed socket's buffer)
            pairs.engine.sendall(_chunk(EVENT))
            time.sleep(0.01)
            report = pairs.report(0.01)
            if report is not None:
                break
        assert report is not None and report[1] == _relay.CLIENT_GONE
        pairs.up.close()  # the loop ends the exchange: the relayer's copy is closed too, so the engine sees EOF
        pairs.engine.settimeout(5)
        _drain_until_eof(pairs.engine)
    finally:
        pairs.close()
    assert _sockets() == sockets


def _drain_until_eof(s: socket.socket) -> None:
    s.setblocking(True)
    s.settimeout(5)
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass


def test_cancel_takes_a_stream_back_at_once(relayer) -> None:
    r, _efd = relayer
    pairs = _Pairs(*relayer)
    try:
        pairs.engine.sendall(_chunk(EVENT))
        time.sleep(0.05)
        report = r.cancel(pairs.token)
        assert report is not None and report[1] == _relay.CANCELLED
        assert r.cancel(pairs.token) is None  # not its any more
        pairs.engine.sendall(_chunk(EVENT))
        time.sleep(0.05)
        assert pairs.received() == _chunk(EVENT)  # nothing relayed after the cancel
    finally:
        pairs.close()


# -- through the front proxy, from a hostile engine -----------------------------------------------------------

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
TOKENS = [_chunk(b'data: {"content":"%d"}\n\n' % i) for i in range(8)]
TAILS = {
    "last": [b"0\r\nx-t: 1\r\n\r\n"],
    "upper": [b"1A\r\n" + b"u" * 26 + b"\r\n", TOKENS[0], b"0\r\n\r\n"],
    "extension": [b"5;x=y\r\nhello\r\n", TOKENS[1], b"0\r\n\r\n"],
    "malformed": [b"zz\r\nhello\r\n"],
    "no-crlf": [b"5\r\nhelloXX" + TOKENS[0]],
    "eof-mid-chunk": [b"1a\r\ndata: {"],
    "size-cut": [b"1", b"a", b"\r", b"\n" + b"s" * 26 + b"\r\n", b"0\r\n\r\n"],
    "reset": ["RST"],
}


class _RawEngine:
    """A TCP server that answers each connection on a thread of its own (`_answer`), its request's head read
    first (`_head`)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    @staticmethod
    def _head(conn: socket.socket) -> bytes | None:
        """What came up to the request head's end (None: the client left first)."""
        head = b""
        while b"\r\n\r\n" not in head:
            data = conn.recv(65536)
            if not data:
                return None
            head += data
        return head

    def _answer(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.sock.close()


class _HostileEngine(_RawEngine):
    """An engine that answers every request with HEAD, TOKENS (a write each, 5 ms apart) and the tail named by
    the request's path (TAILS: each a write; "RST": a reset), then closes."""

    def __init__(self) -> None:
        self.closed_by_peer = threading.Event()
        super().__init__()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            head = self._head(conn)
            if head is None:
                return
            tail = TAILS.get(head.split(b" ")[1].decode().strip("/"), ["flood"])
            try:
                conn.sendall(HEAD)
                for w in TOKENS:
                    conn.sendall(w)
                    time.sleep(0.005)
                for w in tail:
                    if w == "RST":
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                        return
                    if w == "flood":  # until the client leaves: ~50 MB a second
                        while True:
                            conn.sendall(TOKENS[0] * 2000)
                            time.sleep(0.001)
                    conn.sendall(w)  # type: ignore[arg-type]
                    time.sleep(0.005)
            except OSError:
                self.closed_by_peer.set()
            time.sleep(0.05)


def _sockets() -> int:
    """This process's open sockets (the proxy's and the engine's: both run here)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:  # closed meanwhile
            pass
    return n


def _fetch(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())
        out = b""
        while True:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                return out + b"<reset>"
            if not data:
                return out
            out += data


@pytest.fixture(scope="module")
def hostile_engine() -> Iterator[_HostileEngine]:
    e = _HostileEngine()
    yield e
    e.close()


@pytest.mark.parametrize("tail", sorted(TAILS))
def test_a_client_gets_the_same_bytes_through_the_c_relay_as_through_the_loop(hostile_engine, tail: str) -> None:
    got = {}
    for c_relay in (True, False):
        with fp.FrontProxy(("127.0.0.1", 0), ("127.0.0.1", hostile_engine.port), c_relay=c_relay) as p:
            got[c_relay] = _fetch(p.port, tail)
            if c_relay:
                assert p.relayed_in_c_total == 1, "the stream never went to the C relay"
                wait_for(lambda: not p._relayed, 5, what="the stream to come back from the C relay")
    assert got[True] == got[False], tail
    assert got[True].startswith(b"HTTP/1.1 200 ") and TOKENS[-1] in got[True]


ROLE_FIRST_GAP_S = 0.08


ROLE = _chunk(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n')


def _role_first_engine(n_roles: int = 1) -> tuple[socket.socket, int]:
    """An engine answering one streamed chat: `n_roles` role-only deltas (no token), ROLE_FIRST_GAP_S later its
    tokens."""
    sock = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = sock.accept()
        with conn:
            while b"\r\n\r\n" not in conn.recv(65536):
                pass
            conn.sendall(HEAD + ROLE)
            for _ in range(n_roles - 1):
                conn.sendall(ROLE)
            time.sleep(ROLE_FIRST_GAP_S)
            for i in range(6):
                conn.sendall(_chunk(b'data: {"choices":[{"delta":{"content":"%d"}}]}\n\n' % i))
                time.sleep(0.01)
            conn.sendall(b"0\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    return sock, sock.getsockname()[1]


def test_the_first_token_and_the_gaps_through_the_c_relay_are_the_loops() -> None:
    """A stream handed to the C relay at its head (its role-only first chunk relayed there, held for the loop):
    the recorder finds the first token where the loop's own scan finds it, and counts the same gaps."""
    seen = {}
    for c_relay in (True, False):
        sock, port = _role_first_engine()
        try:
            with fp.FrontProxy(("127.0.0.1", 0), ("127.0.0.1", port), c_relay=c_relay) as p:
                got = _fetch(p.port, "v1/chat/completions")
                assert got.endswith(b"0\r\n\r\n") and got.count(b"data:") == 7
                if c_relay:
                    assert p.relayed_in_c_total == 1
                wait_for(lambda: p.in_flight == 0, 5, what="the exchange to end")
                rec = p.latency
                seen[c_relay] = (sum(rec.ttft_counts), sum(rec.itl_counts), rec.ttft_sum_s)
        finally:
            sock.close()
    for c_relay, (n_ttft, n_itl, ttft_s) in seen.items():
        assert (n_ttft, n_itl) == (1, 5), c_relay
        assert ROLE_FIRST_GAP_S <= ttft_s < ROLE_FIRST_GAP_S + 2.0, c_relay  # the first content, not the role


def test_kept_alive_clients_of_a_paced_engine_each_get_every_reply(procs) -> None:
    """Two clients, each on one kept-alive connection, stream chats back to back from an engine stopped and
    continued every few ms (as the pacer does): the C relay takes each stream at its head, ends it there and keeps
    the reads for the first token while the loop looks at them (its reports crossing the engine's writes and the
    streams' ends): every reply comes whole, in time, and nothing stays in flight or in the C relay after."""
    port = free_port()
    argv = engine_command("openai_engine", "--port", str(port), "--ttft-ms", "250", "--itl-ms", "2", "--tokens", "2")
    engine = procs.start(argv, stdout=subprocess.PIPE)
    assert engine.stdout is not None and engine.stdout.readline().split() == ["ready", str(port)]
    stop = threading.Event()

    def pace() -> None:  # stop and continue the engine at random, as a time-division schedule would
        rng = random.Random(7)
        while not stop.is_set():
            os.kill(engine.pid, signal.SIGSTOP)
            time.sleep(rng.uniform(0, 0.01))
            os.kill(engine.pid, signal.SIGCONT)
            time.sleep(rng.uniform(0, 0.01))

    failures: list[str] = []
    chat = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    with fp.FrontProxy(("127.0.0.1", 0), ("127.0.0.1", port)) as p:

        def load(n: int) -> None:
            with httpx.Client(timeout=10) as c:
                for _ in range(n):
                    try:
                        with c.stream("POST", f"http://127.0.0.1:{p.port}/v1/chat/completions", json=chat) as r:
                            body = b"".join(r.iter_raw())
                        if r.status_code != 200 or not body.endswith(b"data: [DONE]\n\n"):
                            failures.append(f"{r.status_code} {body[-80:]!r}")
                    except httpx.HTTPError as e:
                        failures.append(repr(e))
                        return

        pacer = threading.Thread(target=pace, daemon=True)
        clients = [threading.Thread(target=load, args=(12,)) for _ in range(2)]
        pacer.start()
        try:
            for t in clients:
                t.start()
            for t in clients:
                t.join(60)
        finally:
            stop.set()
            pacer.join(5)
            os.kill(engine.pid, signal.SIGCONT)
        assert not failures, failures
        assert p.relayed_in_c_total == 24
        wait_for(lambda: p.in_flight == 0 and not p._relayed, 5, what="every exchange ended, nothing in the C relay")
        assert sum(p.latency.ttft_counts) == 24


def test_an_engine_that_sends_no_token_past_every_budget_is_relayed_whole_and_timed_once() -> None:
    """Role-only deltas past both the recorder's first-token scan and the C relay's hold budget: the client gets
    every byte (the relay's holding pauses the engine only until the loop has looked, and ends where the scan's
    budget ends it), and one first token is counted, as the loop alone counts it."""
    n_roles = 3 * max(PROXY_RELAY_HOLD_MAX_BYTES, LATENCY_FIRST_TOKEN_SCAN_MAX_BYTES) // len(ROLE)
    seen = {}
    for c_relay in (True, False):
        sock, port = _role_first_engine(n_roles)
        try:
            with fp.FrontProxy(("127.0.0.1", 0), ("127.0.0.1", port), c_relay=c_relay) as p:
                got = _fetch(p.port, "v1/chat/completions")
                assert got.endswith(b"0\r\n\r\n") and got.count(b"data:") == n_roles + 6, c_relay
                wait_for(lambda p=p: p.in_flight == 0 and not p._relayed, 5, what="the exchange to end")
                seen[c_relay] = sum(p.latency.ttft_counts)
        finally:
            sock.close()
    assert seen == {True: 1, False: 1}


def test_a_client_that_leaves_mid_stream_ends_the_engines_connection(hostile_engine) -> None:
    with fp.FrontProxy(("127.0.0.1", 0), ("127.0.0.1", hostile_engine.port)) as p:
        sockets = _sockets()
        hostile_engine.closed_by_peer.clear()
        s = socket.create_connection(("127.0.0.1", p.port), timeout=10)
        s.sendall(b"GET /flood HTTP/1.1\r\nHost: x\r\n\r\n")
        seen = b""
        while seen.count(TOKENS[0]) < 3:  # in the flood: the C relay has the stream
            seen += s.recv(65536)
        wait_for(lambda: p.relayed_in_c_total == 1, 5, what="the stream to go to the C relay")
        s.close()
        assert hostile_engine.closed_by_peer.wait(5), "the engine's connection outlived its client"
        wait_for(lambda: p.in_flight == 0 and not p._relayed, 5, what="the exchange to end")
        wait_for(lambda: _sockets() <= sockets, 5, what="every socket of it closed")


_SLOW_CLIENT_PROXY = """
import sys, time
from gpushare_tui.core.engines.front_proxy import FrontProxy
p = FrontProxy(("127.0.0.1", 0), ("127.0.0.1", int(sys.argv[1]))).start()
print(p.port, flush=True)
sys.stdin.readline()
print(p.relayed_in_c_total, flush=True)
"""


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_a_client_that_stops_reading_holds_a_bounded_part_of_the_proxys_memory(hostile_engine) -> None:
    """The engine floods a stream; its client reads three tokens, then nothing for a second: the proxy (a process
    of its own) grows by well under the flood (the C relay stops reading the engine above its budget)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_CLIENT_PROXY, str(hostile_engine.port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port = int(proc.stdout.readline())
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"GET /flood HTTP/1.1\r\nHost: x\r\n\r\n")
        seen = b""
        while seen.count(TOKENS[0]) < 3:
            seen += s.recv(65536)
        rss_before = _rss_kib(proc.pid)
        time.sleep(1.5)  # the flood offers tens of MB meanwhile: the proxy must not keep them
        grown_kib = _rss_kib(proc.pid) - rss_before
        s.settimeout(5)
        for _ in range(20):  # it still relays once the client reads
            seen += s.recv(65536)
        s.close()
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert int(proc.stdout.readline()) == 1
        assert grown_kib < 2 * PROXY_RELAY_OUT_MAX_BYTES // 1024 + 1024, grown_kib
    finally:
        proc.kill()
        proc.wait()


def test_closing_the_proxy_with_a_stream_in_the_c_relay_ends_both_connections(hostile_engine) -> None:
    sockets = _sockets()
    p = fp.FrontProxy(("127.0.0.1", 0), ("127.0.0.1", hostile_engine.port)).start()
    s = socket.create_connection(("127.0.0.1", p.port), timeout=10)
    try:
        hostile_engine.closed_by_peer.clear()
        s.sendall(b"GET /flood HTTP/1.1\r\nHost: x\r\n\r\n")
        seen = b""
        while seen.count(TOKENS[0]) < 3:
            seen += s.recv(65536)
        wait_for(lambda: p.relayed_in_c_total == 1, 5, what="the stream to go to the C relay")
        p.close()
        _drain_until_eof(s)  # the client's connection ends (no hang)
        assert hostile_engine.closed_by_peer.wait(5), "the engine's connection outlived the proxy"
    finally:
        s.close()
        p.close()
    wait_for(lambda: _sockets() <= sockets, 5, what="every socket of it closed")


# -- requests the C relay makes: the engine's response head read and written there ----------------------------


class _ScriptedEngine(_RawEngine):
    """An engine that answers each request with `reply` (its first 256 bytes written in pieces `cut` bytes long,
    2 ms apart), then closes; `requests` counts the requests it read whole."""

    def __init__(self) -> None:
        self.reply = b""
        self.cut = 0
        self.requests = 0
        super().__init__()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            if self._head(conn) is None:
                return
            self.requests += 1
            reply, cut = self.reply, self.cut or len(self.reply) or 1
            try:
                for i in range(0, min(len(reply), 256), cut):  # its first 256 bytes cut, the rest at once
                    conn.sendall(reply[i : min(i + cut, 256)])
                    time.sleep(0.002)
                conn.sendall(reply[256:])
            except OSError:
                pass


@pytest.fixture(scope="module")
def scripted_engine() -> Iterator[_ScriptedEngine]:
    e = _ScriptedEngine()
    yield e
    e.close()


_STATUS_LINES = [
    b"HTTP/1.1 200 OK",
    b"HTTP/1.1 201 Created",
    b"HTTP/1.1 404 Not Found",
    b"HTTP/1.1 200",
    b"HTTP/1.0 200 OK",
    b"HTTP/1.1 204 No Content",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK",
    b"HTTP/1.1 200 \xc3\x96K",
    b"HTTP/1.1 200 OK ",
    b"HTTP/1.1 999 Odd",
    b"HTTP/1.1 20 Short",
    b"HTTP/2 200",
]
_HEADERS = [
    b"Transfer-Encoding: chunked",
    b"transfer-encoding: CHUNKED",
    b"Transfer-Encoding:chunked  ",
    b"Transfer-Encoding: gzip, chunked",
    b"Content-Length: 12",
    b"Connection: close",
    b"Connection: x-a",
    b"X-A: 1",
    b"Keep-Alive: timeout=5, max=100",
    b"TE: trailers",
    b"Upgrade: h2c",
    b"Proxy-Connection: keep-alive",
    b"Trailer: x-t",
    b"Content-Type: text/event-stream",
    b"Content-Type: Application/X-NDJSON; charset=utf-8",
    b"Server: llama.cpp",
    b"Access-Control-Allow-Origin: ",
    b"X-Tab: a\tb",
    b"X-Utf8: \xc3\xa9",
    b"X-Control: a\x01b",
    b" X-Folded: a",
    b"Bad Name: x",
    b"X-Long: " + b"v" * 9000,
    b"X-Past-The-Budget: " + b"v" * PROXY_MAX_HEAD_BYTES,
]
_BODIES = [
    b"5\r\nhello\r\n7\r\n world!\r\n0\r\n\r\n",
    b"5\r\nhello\r\n0\r\nx-t: 1\r\n\r\n",
    b"5;e=1\r\nhello\r\n0\r\n\r\n",
    b"C\r\nhello world!\r\n0\r\n\r\n",
    b"hello world!",
    b"5\r\nhello\r\n0\r\n\r\nextra",
    b"5\r\nhel",
    b"",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    status=st.sampled_from(_STATUS_LINES),
    headers=st.lists(st.sampled_from(_HEADERS), max_size=6),
    bare_lf=st.integers(min_value=-1, max_value=7),
    body=st.sampled_from(_BODIES),
    cut=st.sampled_from([0, 1, 7, 64]),
)
def test_any_response_head_comes_the_same_through_the_c_relays_request_as_through_the_loop(
    scripted_engine, status, headers, bare_lf, body, cut
) -> None:
    """A new engine connection's request is made by the C relay, which writes a plain response head itself and
    hands any other to the loop: whatever head an engine sends, however its writes are cut, the client gets what
    the loop alone would have written (a 502 included; a body the loop frames anew as its reads come, the same
    data), and the engine reads the request once."""
    lines = [status, *headers]
    head = b"".join(line + (b"\n" if i == bare_lf else b"\r\n") for i, line in enumerate(lines)) + b"\r\n"
    scripted_engine.reply, scripted_engine.cut = head + body, cut
    got = {}
    for c_relay in (True, False):
        before = scripted_engine.requests
        with fp.FrontProxy(("127.0.0.1", 0), ("127.0.0.1", scripted_engine.port), c_relay=c_relay) as p:
            got[c_relay] = _fetch(p.port, "x")
            assert p.requests_in_c_total == (1 if c_relay else 0)
            wait_for(lambda: not p._relayed, 5, what="the request to come back from the C relay")
        assert scripted_engine.requests == before + 1
    if got[True] != got[False]:  # a body the loop frames anew (delimited by the engine's close) is chunked by reads
        assert _dechunked(got[True]) == _dechunked(got[False]), (head[:300], body, got[True][:600], got[False][:600])


def _dechunked(reply: bytes) -> tuple[bytes, bytes, bytes]:
    """A reply as (head, body's data, what followed its last chunk) where its head says chunked and its body parses
    as such; else (head, body, b""). `head`: its 1xx heads too (a final head is read after them)."""
    head, _, body = reply.partition(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 1") and body.startswith(b"HTTP/"):  # 1xx, then the final head
        final, _, body = body.partition(b"\r\n\r\n")
        head += b"\r\n\r\n" + final
    if b"transfer-encoding: chunked" not in head.lower():
        return head, body, b""
    data, pos = b"", 0
    while True:
        nl = body.find(b"\r\n", pos)
        try:
            size = int(body[pos:nl].split(b";")[0], 16) if nl >= 0 else -1
        except ValueError:
            size = -1
        if size < 0 or len(body) < nl + 2 + size:
            return head, body, b""
        if size == 0:
            return head, data, body[nl + 2 :]
        data += body[nl + 2 : nl + 2 + size]
        pos = nl + 4 + size


def test_a_plain_streamed_head_is_written_by_the_c_relay_as_the_loop_writes_it(scripted_engine) -> None:
    """llama-server's head for a stream, through the C relay's request and through the loop: the same bytes, the
    head written there (the stream relayed in C from its first byte)."""
    scripted_engine.reply = (
        b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\nX-Accel-Buffering: no\r\n"
        b"Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100\r\n\r\n"
        + b"".join(TOKENS)
        + b"0\r\n\r\n"
    )
    scripted_engine.cut = 0
    got = {}
    for c_relay in (True, False):
        with fp.FrontProxy(("127.0.0.1", 0), ("127.0.0.1", scripted_engine.port), c_relay=c_relay) as p:
            got[c_relay] = _fetch(p.port, "x")
            assert p.relayed_in_c_total == (1 if c_relay else 0) and p.requests_in_c_total == p.relayed_in_c_total
    assert got[True] == got[False]
    head, body = got[True].split(b"\r\n\r\n", 1)
    assert head.endswith(b"Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close")
    assert b"Keep-Alive" not in head and body == b"".join(TOKENS) + b"0\r\n\r\n"


def test_a_kept_engine_connection_the_engine_closed_leaves_the_next_request_to_the_c_relay(scripted_engine) -> None:
    """llama-server closes a stream's connection after its last chunk without saying so in its head: the proxy
    keeps it for the next request as any clean reply's, and the engine's close comes after. The next request is
    still the C relay's to make, on a new connection (it was the loop's, for every stream: the closed one in the
    pool counted as an engine connection to reuse)."""
    stream = b"".join(TOKENS) + b"0\r\n\r\n"
    scripted_engine.reply = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + stream
    )
    scripted_engine.cut = 0
    with fp.FrontProxy(("127.0.0.1", 0), ("127.0.0.1", scripted_engine.port)) as p:
        with socket.create_connection(("127.0.0.1", p.port), timeout=10) as s:  # HTTP/1.0: the loop's
            s.sendall(b"GET /x HTTP/1.0\r\n\r\n")
            while s.recv(65536):
                pass
        wait_for(lambda: len(p._pool) == 1 and p._pool[0].conn.eof, 5, what="the kept connection closed by the engine")
        assert p.requests_in_c_total == 0
        reply = _fetch(p.port, "x")
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b"\r\n\r\n" + stream), reply[:300]
        assert p.requests_in_c_total == 1 and not p._pool


def test_an_engine_that_refuses_or_does_not_answer_the_connect_gets_a_502(scripted_engine) -> None:
    """The engine's port closed: 502 at once. Its backlog full (the SYN dropped): 502 after the connect budget,
    the C relay's deadline, the proxy serving meanwhile."""
    from gpushare_tui.core.host.budgets import PROXY_UPSTREAM_CONNECT_S

    dead = free_port()
    with fp.FrontProxy(("127.0.0.1", 0), ("127.0.0.1", dead)) as p:
        reply = _fetch(p.port, "x")
        assert reply.startswith(b"HTTP/1.1 502 ") and b"engine unreachable" in reply, reply[:200]
        assert p.requests_in_c_total == 1
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    fillers = []
    try:
        for _ in range(8):  # past the accept queue: the next SYN is dropped
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(full.getsockname())
            fillers.append(s)
        time.sleep(0.1)
        with fp.FrontProxy(("127.0.0.1", 0), ("127.0.0.1", full.getsockname()[1])) as p:
            t0 = time.monotonic()
            reply = _fetch(p.port, "x")
            took = time.monotonic() - t0
        assert reply.startswith(b"HTTP/1.1 502 ") and b"engine unreachable" in reply, reply[:200]
        assert PROXY_UPSTREAM_CONNECT_S - 0.1 <= took <= PROXY_UPSTREAM_CONNECT_S + 3, took
    finally:
        for s in fillers:
            s.close()
        full.close()
