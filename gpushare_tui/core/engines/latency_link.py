"""The front proxy's latency figures, carried from its process (proxy_process.py) to the supervisor's: a compact
snapshot of its recorder (core/observe/latency.py) at most every LATENCY_SNAPSHOT_S, one line on their socketpair.

    line = snapshot_line(recorder, now_s)        # the proxy's process: b"latency {...}" (None: nothing new)
    snap = parse_snapshot(payload, received_s)   # the supervisor's: a LatencySnapshot, or None for a bad one

What a snapshot holds: the `status` reply's `latency` (the last minute's p50/p99, the counters, the histograms),
the last GOVERNOR_WINDOW_S's p99s and request count (what the SLO governor judges), and the last minute's TTFT
and ITL sketches, sparse (their non-zero buckets: a target's attainment is read from them). The proxy's process
reads untrusted HTTP; what it sends is checked as any reply from another process (StatusReply's typed parse, each
sketch bucket an index in range and a count), and a line that does not parse is dropped."""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from ..observe.latency import (
    FIGURES,
    LATENCY_SKETCH_BUCKETS,
    LatencyRecorder,
    LatencyReport,
    WindowStats,
    nonzero_span,
)
from ..pacing.control import StatusReply
from ..pacing.governor import GOVERNOR_WINDOW_S, Figures, figures_of

LATENCY_SNAPSHOT_S = 1.0  # the proxy's process sends its figures at most this often (when they changed)
SKETCHED = ("ttft", "itl")  # the figures whose minute sketches travel (targets are on them)
COUNT_MAX = 2**32 - 1  # a sketch bucket's count (an array of "I")


@dataclass(frozen=True)
class LatencySnapshot:
    """The proxy's figures as last received (`received_s`: the supervisor's monotonic clock then)."""

    report: LatencyReport
    recent: Figures  # over the last GOVERNOR_WINDOW_S
    minute: WindowStats  # the last minute's sketches (e2e's is empty)
    received_s: float


def snapshot_line(rec: LatencyRecorder, now_s: float) -> bytes:
    """The recorder's figures as one line (`latency JSON`). Taken once a second on the proxy's process, beside
    its loop: the minute is merged once, and only the sketches' non-zero spans are walked."""
    minute = rec.window(now_s)
    recent = figures_of(rec.window(now_s, GOVERNOR_WINDOW_S))
    doc = {
        "report": _plain(rec.report(now_s, minute)),
        "recent": _plain(recent),
        "minute": {
            "span_s": minute.span_s,
            "requests": minute.requests,
            **{
                f: [[i, n] for i in nonzero_span(s) if (n := s[i])] for f, s in minute.sketches.items() if f in SKETCHED
            },
        },
    }
    return b"latency " + json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()


def _plain(obj: Any) -> dict:
    """A dataclass as JSON's objects, its fields' values as they are (no copy: `asdict` deep-copies each count
    of the histograms)."""
    return {f.name: _plain(v) if is_dataclass(v := getattr(obj, f.name)) else v for f in fields(obj)}


def parse_snapshot(payload: bytes, received_s: float) -> LatencySnapshot | None:
    """A snapshot from its line's payload (after `latency `), or None when it is not one."""
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    report = StatusReply.from_json({"latency": doc.get("report")}).latency
    recent, minute = doc.get("recent"), doc.get("minute")
    if report is None or not isinstance(recent, dict) or not isinstance(minute, dict):
        return None
    requests = recent.get("requests")
    p99s = [recent.get("ttft_p99_ms"), recent.get("itl_p99_ms")]
    if not _count(requests) or not all(p is None or _finite(p) for p in p99s):
        return None
    sketches = {f: _sketch(minute.get(f)) for f in SKETCHED}
    span, ended = minute.get("span_s"), minute.get("requests")
    if any(s is None for s in sketches.values()) or not _finite(span) or not _count(ended):
        return None
    sketches |= {f: array("I", bytes(4 * LATENCY_SKETCH_BUCKETS)) for f in FIGURES if f not in SKETCHED}
    window = WindowStats(float(span), sketches, ended, ())  # type: ignore[arg-type]
    return LatencySnapshot(report, Figures(p99s[0], p99s[1], requests), window, received_s)  # type: ignore[arg-type]


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x < 1e300


def _count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 2**62


def _sketch(pairs: object) -> array | None:
    """A sketch from its non-zero buckets ([[index, count], ...]), None unless each is in range."""
    if not isinstance(pairs, list) or len(pairs) > LATENCY_SKETCH_BUCKETS:
        return None
    out = array("I", bytes(4 * LATENCY_SKETCH_BUCKETS))
    for p in pairs:
        if not (isinstance(p, list) and len(p) == 2 and all(_count(v) for v in p)):
            return None
        i, n = p
        if i >= LATENCY_SKETCH_BUCKETS or n > COUNT_MAX:
            return None
        out[i] = n
    return out


__all__ = ["LATENCY_SNAPSHOT_S", "LatencySnapshot", "parse_snapshot", "snapshot_line"]
