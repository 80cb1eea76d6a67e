"""The per-request latency recorder (core/observe/latency.py): what it counts, from which events, and how close
its last-minute percentiles are to the exact ones. Pure: times are passed in."""

from __future__ import annotations

import json
import math
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare_tui.core.host import budgets
from gpushare_tui.core.observe import latency
from gpushare_tui.core.observe.latency import (
    E2E_BUCKETS_S,
    ITL_BUCKETS_S,
    LATENCY_SKETCH_REL_ERROR,
    TTFT_BUCKETS_S,
    HistogramReport,
    LatencyRecorder,
    carries_token,
    is_stream_content_type,
    nonzero_span,
    sketch_index,
    sketch_value,
)

ROLE = b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOKEN = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
DONE = b"data: [DONE]\n\n"


def test_the_histograms_have_vllms_bounds() -> None:
    """Copied from vLLM's PrometheusStatLogger (vllm/v1/metrics/loggers.py): a board built for vLLM reads ours."""
    assert TTFT_BUCKETS_S == (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                              7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
    assert ITL_BUCKETS_S == (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                             10.0, 20.0, 40.0, 80.0)  # fmt: skip
    assert E2E_BUCKETS_S == (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                             120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


def stream(rec: LatencyRecorder, t0: float, ttft_s: float, gaps_s: list[float], *, role: bool = True) -> float:
    """One streamed 200 reply: head at once, a role delta, the first token after `ttft_s`, one per gap, [DONE]."""
    r = rec.begin(t0)
    rec.head(r, t0 + 0.001, 200, True)
    if role:
        rec.chunk(r, t0 + 0.002, ROLE)
    t = t0 + ttft_s
    rec.chunk(r, t, TOKEN)
    for g in gaps_s:
        t += g
        rec.chunk(r, t, TOKEN)
    rec.chunk(r, t + 0.0001, DONE)
    rec.end(r, t + 0.0002)
    return t + 0.0002


def test_a_stream_gives_its_ttft_gaps_and_e2e() -> None:
    rec = LatencyRecorder(clock_s=lambda: 0.0)
    end = stream(rec, 100.0, 0.25, [0.04] * 9)
    rep = rec.report(end)
    assert rep.ttft_p50_ms == pytest.approx(250, rel=LATENCY_SKETCH_REL_ERROR)  # the role delta is not the token
    assert rep.itl_p50_ms == pytest.approx(40, rel=LATENCY_SKETCH_REL_ERROR)
    assert rep.e2e_p50_ms == pytest.approx((end - 100.0) * 1000, rel=LATENCY_SKETCH_REL_ERROR)
    assert (rep.requests, rep.in_flight, rep.waiting, rep.status_2xx_total) == (1, 0, 0, 1)
    assert rep.itl_hist is not None and rep.itl_hist.counts == (0, 0, 9, *[9] * 17)  # 40 ms: the 0.05 bucket
    assert rep.ttft_hist is not None and rep.ttft_hist.sum_s == pytest.approx(0.25)
    assert rep.ttft_hist.valid() and rep.itl_hist.valid() and rep.e2e_hist is not None and rep.e2e_hist.valid()


def test_a_reply_not_streamed_has_its_first_body_byte_as_ttft_and_no_gaps() -> None:
    rec = LatencyRecorder(clock_s=lambda: 0.0)
    r = rec.begin(10.0)
    rec.head(r, 11.5, 200, False)
    rec.chunk(r, 11.5, b'{"choices":[{"message":{"role":"assistant"')  # not SSE: no parsing, bytes are the reply
    rec.chunk(r, 11.6, b',"content":"x"}}]}')
    rec.end(r, 11.6)
    rep = rec.report(12.0)
    assert rep.ttft_p99_ms == pytest.approx(1500, rel=LATENCY_SKETCH_REL_ERROR)
    assert rep.itl_p50_ms is None and rep.itl_hist is not None and rep.itl_hist.counts[-1] == 0


def test_pings_and_the_end_of_stream_are_no_gaps() -> None:
    rec = LatencyRecorder(clock_s=lambda: 0.0)
    r = rec.begin(0.0)
    rec.head(r, 0.0, 200, True)
    rec.chunk(r, 0.1, TOKEN)
    rec.chunk(r, 30.1, b": ping\n\n")  # llama-server's SSE ping after 30 s of nothing
    rec.chunk(r, 30.2, TOKEN)
    rec.chunk(r, 30.3, DONE)
    rec.end(r, 30.3)
    w = rec.window(30.5)
    assert w.count("itl") == 1 and w.percentile("itl", 0.5) == pytest.approx(30.1, rel=LATENCY_SKETCH_REL_ERROR)


@pytest.mark.parametrize(
    "chunk, token",
    [
        (ROLE, False),
        (TOKEN, True),
        (b": keep-alive\n\n", False),
        (DONE, False),
        (b"data: {}\n\n", False),
        (b'data: {"choices":[{"index":0,"text":" a","finish_reason":null}]}\n\n', True),  # /v1/completions
        (b'data: {"content":"x","stop":false}\n\n', True),  # llama-server's /completion
        (b'data: {"content":"","stop":false}\n\n', False),
        (b'data: {"token":{"id":1,"text":"a"}}\n\n', True),  # TGI's generate_stream
        (b'data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}\n\n', True),
        (b'data: {"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}\n\n', True),
        (b'data: {"choices":[],"usage":{"completion_tokens":5}}\n\n', False),  # a usage-only chunk
        (b'data: {"choices":[{"delta":{"con', True),  # an event split between chunks: bytes of it came
        (b"data: [1, 2]\n\n", True),
        (b"event: message\nid: 3\n\n", False),
        (ROLE + TOKEN, True),
        (b"", False),
    ],
)
def test_what_carries_a_token(chunk: bytes, token: bool) -> None:
    assert carries_token(chunk) is token


def test_the_first_token_scan_is_bounded() -> None:
    """An engine that sends role deltas forever: past the budget, the next chunk is the first token."""
    rec = LatencyRecorder(clock_s=lambda: 0.0)
    r = rec.begin(0.0)
    rec.head(r, 0.0, 200, True)
    n = budgets.LATENCY_FIRST_TOKEN_SCAN_MAX_BYTES // len(ROLE) + 1
    for i in range(n):
        rec.chunk(r, 0.001 * (i + 1), ROLE)
    assert r.last_s is None
    rec.chunk(r, 5.0, ROLE)
    assert r.last_s == 5.0


@pytest.mark.parametrize("status, cls", [(404, "4xx"), (503, "5xx"), (302, "3xx"), (99, "5xx"), (700, "5xx")])
def test_errors_are_counted_by_status_and_have_no_latency(status: int, cls: str) -> None:
    rec = LatencyRecorder(clock_s=lambda: 0.0)
    r = rec.begin(0.0)
    rec.head(r, 0.01, status, False)
    rec.chunk(r, 0.01, b'{"error":"x"}')
    rec.end(r, 0.01)
    rep = rec.report(1.0)
    assert dict(rep.status_totals())[cls] == 1 and sum(n or 0 for _c, n in rep.status_totals()) == 1
    assert rep.requests == 0 and rep.ttft_p99_ms is None and rep.e2e_p99_ms is None


def test_in_flight_and_waiting() -> None:
    rec = LatencyRecorder(clock_s=lambda: 0.0)
    a, b = rec.begin(0.0), rec.begin(0.0)
    assert (rec.in_flight, rec.waiting) == (2, 2)
    rec.head(a, 0.1, 200, True)
    rec.head(a, 0.1, 200, True)  # said twice: counted once
    assert (rec.in_flight, rec.waiting) == (2, 1)
    rec.end(b, 0.2)  # no head: the client left, or the engine closed
    rec.end(b, 0.2)  # ended twice: once
    assert (rec.in_flight, rec.waiting) == (1, 0)
    rec.end(a, 0.3)
    rep = rec.report(1.0)
    assert (rep.in_flight, rep.waiting, rep.status_none_total, rep.status_2xx_total) == (0, 0, 1, 1)


def test_the_window_forgets_what_is_older_than_a_minute() -> None:
    rec = LatencyRecorder(clock_s=lambda: 0.0)
    stream(rec, 100.0, 2.0, [0.5])
    stream(rec, 150.0, 0.1, [0.01])
    assert rec.window(151.0).percentile("ttft", 0.99) == pytest.approx(2.0, rel=LATENCY_SKETCH_REL_ERROR)
    assert rec.window(151.0, window_s=10).percentile("ttft", 0.99) == pytest.approx(0.1, rel=0.03)
    assert rec.window(162.0).percentile("ttft", 0.99) == pytest.approx(0.1, rel=0.03)  # its token at 102 s: out
    assert rec.window(250.0).count("ttft") == 0 and rec.report(250.0).ttft_p99_ms is None
    assert rec.report(250.0).ttft_hist.counts[-1] == 2  # type: ignore[union-attr]  # the histograms keep all


def test_requests_per_second_over_the_time_covered() -> None:
    rec = LatencyRecorder(clock_s=lambda: 100.0)  # started at 100: 10 s old at 110
    for i in range(20):
        stream(rec, 100.0 + i * 0.5, 0.05, [0.01])
    rep = rec.report(110.2)
    assert rep.window_s == pytest.approx(10.2) and rep.req_s == pytest.approx(20 / 10.2)


def test_within_pct_counts_samples_under_a_limit() -> None:
    rec = LatencyRecorder(clock_s=lambda: 0.0)
    for i in range(100):
        stream(rec, 10.0 + i * 0.1, 0.1 if i < 90 else 0.5, [0.01])
    w = rec.window(25.0)
    assert w.within_pct("ttft", 0.3) == pytest.approx(90.0)
    assert w.within_pct("ttft", 0.05) == 0.0 and w.within_pct("ttft", 1.0) == 100.0
    assert w.within_pct("itl", 0.3) == 100.0


@given(st.lists(st.floats(min_value=2e-5, max_value=5e3), min_size=1, max_size=300), st.sampled_from([0.5, 0.99]))
@settings(max_examples=200, deadline=None)
def test_a_percentile_is_within_the_sketchs_error_of_the_exact_one(xs: list[float], q: float) -> None:
    rec = LatencyRecorder(clock_s=lambda: 0.0)
    for x in xs:
        r = rec.begin(1e4 - x)  # every first byte in the same second
        rec.head(r, 1e4, 200, False)
        rec.chunk(r, 1e4, b"{}")
        rec.end(r, 1e4)
    exact = sorted(xs)[max(1, math.ceil(q * len(xs))) - 1]
    got = rec.window(1e4).percentile("ttft", q)
    assert got is not None and abs(got - exact) <= exact * LATENCY_SKETCH_REL_ERROR * 1.0001


@given(st.floats(min_value=0.0, max_value=1e9, allow_nan=False))
def test_sketch_buckets_hold_their_values(x: float) -> None:
    i = sketch_index(x)
    v = sketch_value(i)
    assert 0 <= i and (x <= 1e-5 or x >= 1e4 or abs(v - x) <= x * LATENCY_SKETCH_REL_ERROR * 1.0001)


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["begin", "head", "chunk", "end"]),
        st.integers(0, 7),  # which open request
        st.floats(0.0, 3.0),  # time step
        st.sampled_from([ROLE, TOKEN, DONE, b": ping\n\n", b"", b"{}", b"data: {"]),
        st.sampled_from([200, 204, 404, 500, 99, 700]),
        st.booleans(),
    ),
    max_size=200,
)


@given(EVENTS)
@settings(max_examples=200, deadline=None)
def test_any_order_of_events_keeps_the_counts_consistent(events) -> None:
    """The proxy's events in any order (a head after the end, chunks before the head...): nothing raises, the
    gauges never go below 0 once every request has ended, and each counter adds up."""
    rec = LatencyRecorder(clock_s=lambda: 0.0)
    t = 1000.0
    open_, all_ = [], []
    for what, k, step, data, status, streamed in events:
        t += step
        if what == "begin" or not open_:
            r = rec.begin(t)
            open_.append(r)
            all_.append(r)
            continue
        r = open_[k % len(open_)]
        if what == "head":
            rec.head(r, t, status, streamed)
        elif what == "chunk":
            rec.chunk(r, t, data)
        else:
            rec.end(r, t)
    for r in all_:
        rec.end(r, t)
    rep = rec.report(t)
    assert (rep.in_flight, rep.waiting) == (0, 0)
    assert sum(n or 0 for _c, n in rep.status_totals()) == len(all_)
    for h in (rep.ttft_hist, rep.itl_hist, rep.e2e_hist):
        assert h is not None and h.valid()
    assert rep.e2e_hist is not None and rep.e2e_hist.counts is not None
    assert rep.e2e_hist.counts[-1] == rep.status_2xx_total


@pytest.mark.parametrize(
    "hist, ok",
    [
        (HistogramReport((0.1, 0.2), (1, 2, 3), 0.5), True),
        (HistogramReport((0.1, 0.2), (1, 2), 0.5), False),  # no +Inf
        (HistogramReport((0.2, 0.1), (1, 2, 3), 0.5), False),  # not ascending
        (HistogramReport((0.1, 0.2), (3, 2, 3), 0.5), False),  # not cumulative
        (HistogramReport((0.1, 0.2), (-1, 2, 3), 0.5), False),
        (HistogramReport((0.1, math.inf), (1, 2, 3), 0.5), False),
        (HistogramReport((0.1, 0.2), (1, 2, 3), math.nan), False),
        (HistogramReport(None, (1,), 0.0), False),
    ],
)
def test_a_histogram_sent_by_an_engine_is_checked(hist: HistogramReport, ok: bool) -> None:
    assert hist.valid() is ok


@pytest.mark.parametrize(
    "ctype, streamed",
    [
        (b"text/event-stream", True),
        (b"text/event-stream; charset=utf-8", True),
        ("Text/Event-Stream", True),
        (b"application/x-ndjson", True),
        (b"application/json", False),
        (b"", False),
    ],
)
def test_stream_content_types(ctype: bytes | str, streamed: bool) -> None:
    assert is_stream_content_type(ctype) is streamed


@given(
    st.lists(st.tuples(st.floats(0.0, 90.0), st.floats(0.0, 3.0), st.floats(0.0, 2.0)), min_size=1, max_size=60),
    st.floats(0.0, 150.0),
    st.integers(1, 70),
)
@settings(max_examples=300, deadline=None)
def test_the_windows_count_what_a_plain_list_of_samples_would(reqs, later_s: float, span: int) -> None:
    """The running total and its turns against a list of every sample with the second it counts in: requests
    one after another (gaps up to 90 s, past the window), each with a TTFT and one gap; read later."""
    rec = LatencyRecorder(clock_s=lambda: 0.0)
    samples: list[tuple[int, str, float]] = []
    t, cur = 1000.0, -1
    for pause, ttft, gap in reqs:
        t += pause
        r = rec.begin(t)
        rec.head(r, t, 200, True)
        for figure, value, at in (("ttft", ttft, t + ttft), ("itl", gap, t + ttft + gap)):
            rec.chunk(r, at, TOKEN)
            cur = max(cur, int(at))
            samples.append((cur, figure, value))
        t += ttft + gap
        rec.end(r, t)
        cur = max(cur, int(t))
        samples.append((cur, "e2e", t - (t - ttft - gap)))
    now = t + later_s
    for window_s in (span, None):
        first = int(now) - min(60, window_s or 60) + 1
        w = rec.window(now, window_s)
        for figure in ("ttft", "itl", "e2e"):
            inside = sorted(v for sec, f, v in samples if f == figure and first <= sec <= int(now))
            assert w.count(figure) == len(inside), (figure, window_s)
            if inside:
                got = w.percentile(figure, 0.99)
                assert (
                    got is not None
                    and abs(got - inside[math.ceil(0.99 * len(inside)) - 1]) <= inside[-1] * 0.011 + 1e-5
                )


@given(st.lists(st.integers(0, 3), max_size=40))
def test_a_sketch_span_runs_from_its_first_non_zero_count_to_its_last(counts: list[int]) -> None:
    a = array("I", counts)
    nonzero = [i for i, n in enumerate(counts) if n]
    assert nonzero_span(a) == (range(nonzero[0], nonzero[-1] + 1) if nonzero else range(0))


@given(
    st.one_of(
        st.binary(max_size=40).map(lambda b: b"{" + b),
        st.text().map(lambda t: ("{" + t).encode("utf-8", "surrogatepass")),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(),
            lambda c: st.lists(c) | st.dictionaries(st.text(), c),
        ).map(lambda d: json.dumps({"content": d}).encode() + b" \r\n"),
    )
)
@settings(max_examples=500)
def test_an_events_json_is_read_as_json_loads_reads_it(payload: bytes) -> None:
    """The first-token check reads an event's JSON object without json.loads' Python layers: the same value,
    or a ValueError where json.loads raises one."""
    try:
        want = ("value", json.loads(payload))
    except ValueError:
        want = ("error", None)
    try:
        got = ("value", latency._json_of(payload))
    except ValueError:
        got = ("error", None)
    assert repr(got) == repr(want)
