"""front_proxy._Relay's chunked relay: a read taken in one step (one whole chunk) and the same bytes scanned in
parts give the client the same bytes, the recorder the same tokens, and the same end."""

from __future__ import annotations

import asyncio

import pytest

from gpushare_tui.core.engines import front_proxy as fp
from gpushare_tui.core.observe.latency import LatencyRecorder

EVENT = b'data: {"content":" the"}\n\n'


class _Transport:
    def __init__(self) -> None:
        self.out = bytearray()

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.out += data


def _relay(reads: list[bytes], one_step: bool = True) -> tuple[bytes, int, bool, BaseException | None]:
    """What the client got, the tokens recorded, whether the body ended, and its failure (`one_step` False: every
    read scanned, as before the one-step path)."""

    async def run() -> tuple[bytes, int, bool, BaseException | None]:
        conn = fp._Conn()
        conn.transport = _Transport()  # type: ignore[assignment]
        cl = fp._Client(conn, 0.0)
        got = fp.parse_response_head(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
        assert got is not None
        relay = fp._Relay(cl, got[0], "chunked", 0, True, None)
        rec = LatencyRecorder(clock_s=lambda: 0.0)
        req = rec.begin(0.0)
        rec.head(req, 0.0, 200, True)
        relay.rec, relay.rec_req, relay.clock = rec, req, iter(range(1, 1000)).__next__  # type: ignore[assignment]
        for data in reads:
            relay.quick = relay.quick and one_step
            relay.feed(data)
        failed = relay.done.exception() if relay.done.done() else None
        return bytes(conn.transport.out), sum(rec.itl_counts) + sum(rec.ttft_counts), relay.ended, failed  # type: ignore[attr-defined]

    return asyncio.run(run())


def _chunk(data: bytes, size: bytes | None = None) -> bytes:
    return (size if size is not None else b"%x" % len(data)) + b"\r\n" + data + b"\r\n"


@pytest.mark.parametrize(
    "size",
    [None, b"%X" % len(EVENT), b"00%x" % len(EVENT)],
    ids=["lower", "upper", "leading-zeros"],
)
def test_whole_chunk_reads_and_byte_reads_relay_the_same(size: bytes | None) -> None:
    body = _chunk(EVENT, size) * 3 + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    reads = [_chunk(EVENT, size)] * 3 + [_chunk(b"data: [DONE]\n\n"), b"0\r\n\r\n"]
    whole, scanned = _relay(reads), _relay(reads, one_step=False)
    bytewise = _relay([body[i : i + 1] for i in range(len(body))])
    assert whole[0] == scanned[0] == bytewise[0] == body[: -len(b"0\r\n\r\n")]  # the last chunk is written at the end
    assert whole[1] == scanned[1] == 3  # the [DONE] event is no token
    assert whole[2:] == scanned[2:] == bytewise[2:] == (True, None)


def test_a_read_shaped_like_a_chunk_is_read_by_its_size() -> None:
    # "5 CRLF hel CRLF CRLF" is one chunk of 5 bytes ("hel" CRLF) then its CRLF: a valid body, relayed as is
    out, _tokens, ended, failed = _relay([b"5\r\nhel\r\n\r\n", b"0\r\n\r\n"])
    assert out == b"5\r\nhel\r\n\r\n" and ended and failed is None


def test_a_chunk_whose_size_lies_ends_the_body_where_it_went_wrong() -> None:
    good = _chunk(EVENT)
    out, _tokens, ended, failed = _relay([good, b"5\r\nhello!\r\n"])
    assert out.startswith(good) and ended and isinstance(failed, fp._Cut)


def test_a_last_chunk_that_ends_in_a_read_of_its_own_is_no_token() -> None:
    """llama-server may write the last chunk's `0 CRLF` and its final CRLF apart: that read is the body's end,
    not a token (an ITL sample was counted for it)."""
    _out, tokens, ended, failed = _relay([_chunk(EVENT)] * 3 + [b"0\r\n", b"\r\n"])
    assert tokens == 3 and ended and failed is None
