"""Latency as clients see it: per-request timings of an engine's front proxy, kept per engine as cumulative
histograms (vLLM's names and buckets: what users' Grafana boards already read) and as figures over the last
minute (p50/p99, requests per second, requests by status, attainment of a target).

    rec = LatencyRecorder()
    r = rec.begin(t)                       # the request's body received: TTFT and e2e count from here
    rec.head(r, t, status, streamed)       # the response's head (first response byte)
    rec.chunk(r, t, data)                  # each response body chunk as relayed (the hot path)
    rec.end(r, t)                          # the response's end, or either side closing (always, once)
    rec.report(now)                        # LatencyReport: the `status` reply's `latency` object

What each figure is (measured at the proxy, so it includes the time an engine sits stopped outside its
window, which is what a client waits through):
- TTFT: body received -> the first response chunk that carries a token. For an SSE stream (`streamed`) a
  chunk that carries no token (an OpenAI role-only delta, an SSE comment or ping, `[DONE]`) is not the first
  token (`carries_token`); for a reply that is not streamed, its first body byte (a non-streamed completion
  sends its whole reply when done: its TTFT is its whole compute time).
- ITL: the gap between two response chunks of a streamed reply after its first token (an SSE comment or ping
  is no chunk); one chunk may carry several tokens when the engine writes faster than the proxy reads.
- E2E: body received -> the response's end.
TTFT, ITL and E2E are of 2xx replies only (an error answered at once is no latency); every request is counted
by its status class (`status_none`: no response head at all, e.g. the client left first).

Cost: `chunk` is called once per relayed chunk on the proxy's event loop; it does a few arithmetic steps, a
bisect and two array increments (bench/latency_record.py measures it). Memory is fixed: the cumulative
histograms have vLLM's buckets; the last minute is a ring of LATENCY_WINDOW_S one-second slots, each an
array of LATENCY_SKETCH_BUCKETS counts per figure (log-spaced: a percentile is within
LATENCY_SKETCH_REL_ERROR of the exact one), whatever the request rate or the latencies.

One writer (the proxy's thread); `report` and `window` may run on any other thread. Completed seconds are never
written again; the current one is written in place (a sample racing a read is in this read's figures or the
next's); the running total of the window changes only when the second turns, under a lock the readers take."""

from __future__ import annotations

import json
import math
import threading
import time
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import add, sub
from typing import Any

from ..host.budgets import LATENCY_FIRST_TOKEN_SCAN_MAX_BYTES, LATENCY_WINDOW_S

# vLLM's histograms (vllm/v1/metrics/loggers.py, PrometheusStatLogger): the same names (our prefix before them)
# and the same upper bounds in seconds, so a board built for vLLM reads ours.
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)  # fmt: skip
FIGURES = ("ttft", "itl", "e2e")
HISTOGRAM_NAMES = {  # figure -> vLLM's name (without its `vllm:` prefix)
    "ttft": "time_to_first_token_seconds",
    "itl": "inter_token_latency_seconds",
    "e2e": "e2e_request_latency_seconds",
}
BUCKETS_S = {"ttft": TTFT_BUCKETS_S, "itl": ITL_BUCKETS_S, "e2e": E2E_BUCKETS_S}
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx", "none")  # a final status outside 200-599 counts as 5xx

# The last minute's sketch: bucket i > 0 holds (SKETCH_MIN_S·γ^(i-1), SKETCH_MIN_S·γ^i]; bucket 0 all ≤ SKETCH_MIN_S,
# the last all above SKETCH_MAX_S. A percentile is its bucket's geometric middle: within (√γ - 1) of the exact one.
SKETCH_GAMMA = 1.02
SKETCH_MIN_S = 1e-5
SKETCH_MAX_S = 1e4
LATENCY_SKETCH_BUCKETS = math.ceil(math.log(SKETCH_MAX_S / SKETCH_MIN_S) / math.log(SKETCH_GAMMA)) + 2
LATENCY_SKETCH_REL_ERROR = math.sqrt(SKETCH_GAMMA) - 1
_INV_LOG_GAMMA = 1.0 / math.log(SKETCH_GAMMA)
_INV_MIN = 1.0 / SKETCH_MIN_S
_LAST = LATENCY_SKETCH_BUCKETS - 1
_ZEROS = bytes(4 * LATENCY_SKETCH_BUCKETS)
# a stream's event that begins so is no token: an SSE comment (a ping), the end of an OpenAI stream
NOT_TOKENS = (b":", b"data: [DONE]")
_log = math.log


def sketch_index(x_s: float) -> int:
    """The sketch bucket of a duration (s)."""
    if x_s <= SKETCH_MIN_S:
        return 0
    return min(_LAST, int(math.log(x_s * _INV_MIN) * _INV_LOG_GAMMA) + 1)


def sketch_value(i: int) -> float:
    """What bucket `i` stands for (s): its geometric middle (the bounds for the first and last)."""
    if i <= 0:
        return SKETCH_MIN_S
    if i >= _LAST:
        return SKETCH_MAX_S
    return SKETCH_MIN_S * SKETCH_GAMMA ** (i - 0.5)


def status_class_index(status: int | None) -> int:
    """Index in STATUS_CLASSES of a final status (None: no response head)."""
    if status is None:
        return 4
    if 200 <= status < 300:
        return 0
    if 300 <= status < 400:
        return 1
    return 2 if 400 <= status < 500 else 3


# the Content-Types (lower case, as prefixes) of a token stream: SSE, and NDJSON as Ollama streams
STREAM_CONTENT_TYPES = (b"text/event-stream", b"application/x-ndjson")


def is_stream_content_type(value: bytes | str) -> bool:
    """Whether a response Content-Type is a token stream (STREAM_CONTENT_TYPES), whose chunks are tokens: the
    proxy passes it to `head` as `streamed`."""
    v = value.lower() if isinstance(value, bytes) else value.lower().encode("latin-1", "replace")
    return v.startswith(STREAM_CONTENT_TYPES)


_TEXT_KEYS = ("content", "text", "reasoning_content", "tool_calls")


def carries_token(data: bytes) -> bool:
    """Whether an SSE chunk carries a token: a `data:` event other than `[DONE]` whose JSON is not an object
    without text (an OpenAI role-only or usage-only delta, an empty `content`), or whose JSON does not parse
    (an event split between chunks: bytes of it arrived). Comments, pings and blank lines carry none."""
    for line in data.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            continue
        try:
            doc = _json_of(payload)
        except (ValueError, RecursionError):
            return True
        if not isinstance(doc, dict) or _has_text(doc):
            return True
    return False


_scan_json = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the C scanner json.loads ends in


def _json_of(payload: bytes) -> Any:
    """json.loads(payload), ValueError as it raises: an object in UTF-8 (an event's usual payload; no NUL in its
    first bytes, where json.loads would read UTF-16 or -32) is scanned at once, without json.loads' layers of
    Python (this runs once a stream, on the proxy's loop, with every cache cold)."""
    if payload[:1] != b"{" or b"\0" in payload[:4]:
        return json.loads(payload)
    text = payload.decode("utf-8", "surrogatepass")  # as json.loads decodes
    try:
        doc, end = _scan_json(text, 0)
    except StopIteration:
        raise ValueError("no JSON value") from None
    if end != len(text) and text[end:].strip(" \t\n\r"):
        raise ValueError("data after the JSON value")
    return doc


def _has_text(doc: dict) -> bool:
    """An OpenAI chunk (choices[].delta.content / .text / ...), llama-server's own (`content`) or TGI's
    (`token.text`) with non-empty text."""
    places = [doc]
    choices = doc.get("choices")
    if isinstance(choices, list):
        for c in choices:
            if isinstance(c, dict):
                places.append(c)
                if isinstance(c.get("delta"), dict):
                    places.append(c["delta"])
    if isinstance(doc.get("token"), dict):
        places.append(doc["token"])
    return any(bool(p.get(k)) for p in places for k in _TEXT_KEYS)


class Request:
    """One request's timing (monotonic s), as the recorder follows it."""

    __slots__ = ("start_s", "last_s", "ok", "streamed", "status", "scanned", "ended")

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s
        self.last_s: float | None = None  # its last token chunk (None: no token yet)
        self.ok = False  # a 2xx head came: its timings count
        self.streamed = False
        self.status: int | None = None
        self.scanned = 0  # bytes looked at for a first token
        self.ended = False


class _Slot:
    """One second of the window (`sec`; the running total: the seconds it sums): a sketch per figure (FIGURES
    order), 2xx requests ended, requests by status class."""

    __slots__ = ("sec", "sketches", "ended", "by_status")

    def __init__(self, sec: int) -> None:
        self.sec = sec
        self.sketches = (array("I", _ZEROS), array("I", _ZEROS), array("I", _ZEROS))
        self.ended = 0
        self.by_status = [0] * len(STATUS_CLASSES)

    def add(self, other: _Slot, sign: int = 1) -> None:
        for acc, part in zip(self.sketches, other.sketches):
            _add(acc, part, sign)
        self.ended += sign * other.ended
        self.by_status = [a + sign * b for a, b in zip(self.by_status, other.by_status)]

    def copy(self) -> _Slot:
        out = _Slot(self.sec)
        out.sketches = tuple(array("I", a) for a in self.sketches)  # type: ignore[assignment]
        out.ended, out.by_status = self.ended, list(self.by_status)
        return out


class LatencyRecorder:
    """An engine's latency figures, fed by its front proxy (see the module). `clock_s` is the clock `report`
    uses when not given `now_s` (the proxy passes its own times to the events).

    The last second's slot is written in place by the events; at each new second it is folded into a running
    total of the completed seconds in the window, and the seconds that left the window are taken out of it
    (under `_lock`, which only that turn and readers take): reading the whole window costs a copy of the total
    and of the current second, not a merge of sixty."""

    def __init__(self, clock_s=time.monotonic, window_s: int = LATENCY_WINDOW_S) -> None:
        self._clock = clock_s
        self.window_s = window_s
        self.started_s = clock_s()
        self._lock = threading.Lock()
        self._ring = [_Slot(-1) for _ in range(window_s)]
        self._cur = _Slot(-1)
        self._sec_end = 0.0  # where the current slot's second ends: an event at or past it turns the ring
        self._itl_sketch = self._cur.sketches[1]  # the current slot's, for the hot path
        self._total = _Slot(-1)  # the completed seconds from _total_lo to the current one (excluded)
        self._total_lo = 0
        self.in_flight = 0  # body received, response not ended
        self.waiting = 0  # of those, no response head yet
        self.by_status = [0] * len(STATUS_CLASSES)  # since this recorder started
        self.ttft_counts = [0] * (len(TTFT_BUCKETS_S) + 1)  # per bucket, not cumulative; the last is +Inf
        self.itl_counts = [0] * (len(ITL_BUCKETS_S) + 1)
        self.e2e_counts = [0] * (len(E2E_BUCKETS_S) + 1)
        self.ttft_sum_s = 0.0
        self.itl_sum_s = 0.0
        self.e2e_sum_s = 0.0

    def _slot(self, t_s: float) -> _Slot:
        """The slot an event at `t_s` counts in: this second's (a late event, timed before the last turn of
        the second, counts in the current one)."""
        sec = int(t_s)
        cur = self._cur
        if sec <= cur.sec:
            return cur
        with self._lock:
            self._total.add(cur)  # completed
            lo = sec - self.window_s + 1  # the first second still in the window
            for old in self._ring:
                if self._total_lo <= old.sec < lo and old.sec <= cur.sec:
                    self._total.add(old, -1)
            self._total_lo = max(self._total_lo, lo)
            slot = self._ring[sec % self.window_s] = self._cur = _Slot(sec)  # its old second was taken out above
            self._sec_end = sec + 1.0
            self._itl_sketch = slot.sketches[1]
        return slot

    # -- the proxy's events -----------------------------------------------------------------------------

    def begin(self, t_s: float) -> Request:
        """A request's body was received (monotonic s): it is in flight and waits for its response."""
        self.in_flight += 1
        self.waiting += 1
        return Request(t_s)

    def head(self, r: Request, t_s: float, status: int, streamed: bool) -> None:
        """Its final response head came (`status`; `streamed`: is_stream_content_type of its Content-Type)."""
        if r.status is None and not r.ended:
            self.waiting -= 1
        r.status = status
        r.ok = 200 <= status < 300
        r.streamed = streamed

    def chunk(self, r: Request, t_s: float, data: bytes, at: int = 0) -> None:
        """A response body chunk was relayed to the client at `t_s`; its event begins at `at` (a chunked body's
        read as relayed: after its chunk-size line)."""
        last = r.last_s
        if last is not None:
            if not r.streamed or data.startswith(NOT_TOKENS, at):
                return  # a reply's rest, an SSE comment (a ping) or the stream's end: no token
            self.tokens(r, (t_s,))
            return
        if not r.ok or not data:
            return
        if r.streamed and r.scanned < LATENCY_FIRST_TOKEN_SCAN_MAX_BYTES:
            r.scanned += len(data)
            if not carries_token(data):
                return
        r.last_s = t_s
        ttft = t_s - r.start_s
        self.ttft_counts[bisect_left(TTFT_BUCKETS_S, ttft)] += 1
        self.ttft_sum_s += ttft
        self._slot(t_s).sketches[0][sketch_index(ttft)] += 1

    def reads(self, r: Request, reads: Sequence[tuple[float, int, bytes]]) -> None:
        """Reads a relay relayed and kept for this, in order (the C relay's held reads: time, where the event
        begins, bytes): each told as `chunk` is told until the first token, the tokens after it in one batch."""
        i, n = 0, len(reads)
        while i < n and r.last_s is None:
            t_s, at, data = reads[i]
            self.chunk(r, t_s, data, at)
            i += 1
        if i < n and r.last_s is not None and r.streamed:  # as `chunk` counts a token once the first has come
            self.tokens(r, [t_s for t_s, at, data in reads[i:] if not data.startswith(NOT_TOKENS, at)])

    def tokens(self, r: Request, times_s: Iterable[float]) -> None:
        """Tokens of a stream whose first has come (`chunk` said so) arrived at `times_s`, in order: a relay that
        looked at its reads itself, as `chunk` does, gives them here in a batch (one call, not one a token)."""
        last = r.last_s
        assert last is not None
        counts, sketch, sec_end = self.itl_counts, self._itl_sketch, self._sec_end
        total_s = 0.0
        for t_s in times_s:
            gap = t_s - last
            last = t_s
            counts[bisect_left(ITL_BUCKETS_S, gap)] += 1
            total_s += gap
            if t_s >= sec_end:
                self._slot(t_s)
                sketch, sec_end = self._itl_sketch, self._sec_end
            if gap > SKETCH_MIN_S:  # sketch_index, inlined: this is the one event per token
                i = int(_log(gap * _INV_MIN) * _INV_LOG_GAMMA) + 1
                sketch[i if i < _LAST else _LAST] += 1
            else:
                sketch[0] += 1
        self.itl_sum_s += total_s
        r.last_s = last

    def end(self, r: Request, t_s: float) -> None:
        """Its response ended (or either side closed): called once per `begin`, whatever happened."""
        if r.ended:
            return
        r.ended = True
        self.in_flight -= 1
        if r.status is None:
            self.waiting -= 1
        k = status_class_index(r.status)
        self.by_status[k] += 1
        slot = self._slot(t_s)
        slot.by_status[k] += 1
        if not r.ok:
            return
        e2e = t_s - r.start_s
        self.e2e_counts[bisect_left(E2E_BUCKETS_S, e2e)] += 1
        self.e2e_sum_s += e2e
        slot.sketches[2][sketch_index(e2e)] += 1
        slot.ended += 1

    # -- reading ----------------------------------------------------------------------------------------

    def window(self, now_s: float | None = None, window_s: float | None = None) -> WindowStats:
        """The figures of the last `window_s` seconds (default and at most the recorder's window): the whole
        seconds before `now_s` and the current one."""
        now = self._clock() if now_s is None else now_s
        span = min(self.window_s, max(1, math.ceil(window_s if window_s is not None else self.window_s)))
        sec = int(now)
        first = sec - span + 1
        with self._lock:
            cur = self._cur.copy()
            ring = list(self._ring)
            total = self._total.copy() if span == self.window_s else None
            total_lo = self._total_lo
        if total is None:  # a shorter window: its completed seconds summed (never written again)
            merged = _Slot(sec)
            for old in ring:
                if first <= old.sec < cur.sec:
                    merged.add(old)
        else:  # the whole window: the running total less the seconds that left it since the last turn
            merged = total
            for old in ring:
                if total_lo <= old.sec < min(first, cur.sec):
                    merged.add(old, -1)
        if first <= cur.sec:
            merged.add(cur)
        covered_s = min(float(span), max(1.0, now - self.started_s))
        return WindowStats(covered_s, dict(zip(FIGURES, merged.sketches)), merged.ended, tuple(merged.by_status))

    def histograms(self) -> dict[str, HistogramReport]:
        """The cumulative histograms since this recorder started, by figure."""
        sums = {"ttft": self.ttft_sum_s, "itl": self.itl_sum_s, "e2e": self.e2e_sum_s}
        counts = {"ttft": self.ttft_counts, "itl": self.itl_counts, "e2e": self.e2e_counts}
        return {f: HistogramReport(BUCKETS_S[f], tuple(accumulate(list(counts[f]))), sums[f]) for f in FIGURES}

    def report(self, now_s: float | None = None, minute: WindowStats | None = None) -> LatencyReport:
        """The `status` reply's `latency`: the last minute's figures (`minute`: `window(now_s)`, taken already),
        what is in flight, the counters and the cumulative histograms."""
        w = minute if minute is not None else self.window(now_s)
        ms = {}
        for f in FIGURES:
            ms[f"{f}_p50_ms"], ms[f"{f}_p99_ms"] = (_ms(x) for x in w.percentiles(f, (0.5, 0.99)))
        statuses = {f"status_{c}_total": n for c, n in zip(STATUS_CLASSES, self.by_status)}
        hist = self.histograms()
        fields: dict[str, object] = {
            "window_s": w.span_s,
            "requests": w.requests,
            "req_s": w.requests / w.span_s,
            "in_flight": max(0, self.in_flight),
            "waiting": max(0, self.waiting),
            **ms,
            **statuses,
            **{f"{f}_hist": hist[f] for f in FIGURES},
        }
        return LatencyReport(**fields)  # type: ignore[arg-type]


def nonzero_span(counts: array) -> range:
    """The indices from a sketch's first non-zero count to its last (empty when all are zero), found by C-level
    byte scans: latencies cluster in a few dozen of the sketch's buckets, so a walk of them costs microseconds,
    not a walk of every bucket."""
    raw = counts.tobytes()
    stripped = raw.lstrip(b"\0")
    if not stripped:
        return range(0)
    return range((len(raw) - len(stripped)) // counts.itemsize, -(-len(raw.rstrip(b"\0")) // counts.itemsize))


def _add(acc: array, part: array, sign: int = 1) -> None:
    """acc += sign * part, over part's non-zero span only."""
    span = nonzero_span(part)
    if not span:
        return
    lo, hi = span.start, span.stop
    acc[lo:hi] = array(acc.typecode, map(add if sign > 0 else sub, acc[lo:hi], part[lo:hi]))


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1000, 3)


@dataclass(frozen=True)
class WindowStats:
    """The last `span_s` seconds of an engine's requests: a sketch per figure (counts by sketch bucket), the
    2xx requests that ended, and every request that ended by status class (STATUS_CLASSES order)."""

    span_s: float
    sketches: dict[str, array]
    requests: int
    by_status: tuple[int, ...]

    def count(self, figure: str) -> int:
        return sum(self.sketches[figure])

    def percentile(self, figure: str, q: float) -> float | None:
        """The `q` quantile (0-1, nearest rank) of `figure` over the window (s), None without samples."""
        return self.percentiles(figure, (q,))[0]

    def percentiles(self, figure: str, qs: tuple[float, ...]) -> tuple[float | None, ...]:
        """The quantiles `qs` of `figure` (one pass over its sketch)."""
        cumulative = list(accumulate(self.sketches[figure]))
        n = cumulative[-1]
        if n == 0:
            return (None,) * len(qs)
        return tuple(sketch_value(bisect_left(cumulative, max(1, math.ceil(q * n)))) for q in qs)

    def within_pct(self, figure: str, limit_s: float) -> float | None:
        """% of `figure`'s samples at or below `limit_s` (a sample in the bucket holding `limit_s` counts as
        within when the bucket's middle is), None without samples."""
        counts = self.sketches[figure]
        n = sum(counts)
        if n == 0:
            return None
        top = sketch_index(limit_s)
        inside = sum(counts[:top]) + (counts[top] if sketch_value(top) <= limit_s else 0)
        return 100.0 * inside / n


@dataclass(frozen=True)
class HistogramReport:
    """A cumulative histogram as Prometheus has it: upper bounds `le` (s, ascending), cumulative `counts`
    (one per bound, then +Inf: the total), the sum of the samples (s)."""

    le: tuple[float, ...] | None = None
    counts: tuple[int, ...] | None = None
    sum_s: float | None = None

    def valid(self) -> bool:
        """What a reader checks before exporting one it was sent (a hostile reply may hold anything): finite
        ascending bounds, non-negative non-decreasing counts one longer than them, a finite sum."""
        le, counts = self.le, self.counts
        if le is None or counts is None or self.sum_s is None or len(counts) != len(le) + 1:
            return False
        if not all(math.isfinite(b) for b in le) or any(b >= c for b, c in zip(le, le[1:])):
            return False
        return counts[0] >= 0 and all(a <= b for a, b in zip(counts, counts[1:])) and math.isfinite(self.sum_s)


@dataclass(frozen=True)
class LatencyReport:
    """An engine's latency figures as its control socket reports them (`status`'s `latency`; None: unknown).
    The p50/p99 (ms) and `requests`/`req_s` (2xx replies ended) are over the last `window_s` seconds;
    `in_flight`/`waiting` are now; the `status_*_total` counters and the histograms since the recorder (the
    engine's supervisor) started."""

    window_s: float | None = None
    requests: int | None = None
    req_s: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p99_ms: float | None = None
    in_flight: int | None = None
    waiting: int | None = None
    status_2xx_total: int | None = None
    status_3xx_total: int | None = None
    status_4xx_total: int | None = None
    status_5xx_total: int | None = None
    status_none_total: int | None = None
    ttft_hist: HistogramReport | None = None
    itl_hist: HistogramReport | None = None
    e2e_hist: HistogramReport | None = None

    def histogram(self, figure: str) -> HistogramReport | None:
        return {"ttft": self.ttft_hist, "itl": self.itl_hist, "e2e": self.e2e_hist}[figure]

    def status_totals(self) -> tuple[tuple[str, int | None], ...]:
        return tuple((c, getattr(self, f"status_{c}_total")) for c in STATUS_CLASSES)
