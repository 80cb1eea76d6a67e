"""What the per-request latency recorder (gpushare_tui/core/observe/latency.py) costs the front proxy's hot path,
per event, against the cost of an empty Python method call (the floor any hook pays).

    python -m bench.latency_record [--events 200000] [--rounds 5]

Events timed (each a batch of back-to-back calls; the median batch of --rounds is reported, and the min):
    chunk (token)     `chunk` of a streamed reply after its first token: an inter-token gap recorded
    chunk (ping)      `chunk` of an SSE comment (a ping): looked at, not recorded
    first token       `chunk` that is a request's first token (its SSE event parsed once: `carries_token`)
    role delta        `chunk` of an OpenAI role-only delta before the first token (parsed, not a token)
    request           one whole request's own events: begin, head, end (no chunks)
    report            `report()` over a full minute of traffic (the control socket's `status`, every ~2 s)
Prints ns per event and writes bench/results/latency_record.json. Run it through cpu-turn: a figure taken
while other jobs load the cores measures them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from gpushare_tui.core.observe.latency import LatencyRecorder

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":" the"},"finish_reason":null}]}\n\n'
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
PING = b": ping\n\n"


class _Empty:
    def chunk(self, r: object, t: float, data: bytes) -> None:
        pass


def _streaming(rec: LatencyRecorder, t: float):  # a request past its first token
    r = rec.begin(t)
    rec.head(r, t, 200, True)
    rec.chunk(r, t + 0.001, TOKEN)
    return r


def per_event_ns(events: int, rounds: int) -> dict[str, tuple[float, float]]:
    """name -> (median, min) ns per event over `rounds` batches of `events`."""
    out: dict[str, list[float]] = {}

    def timed(name: str, run) -> None:
        t0 = time.perf_counter_ns()
        n = run()
        out.setdefault(name, []).append((time.perf_counter_ns() - t0) / n)

    for _ in range(rounds):
        empty = _Empty()

        def floor(n: int = events, empty: _Empty = empty) -> int:
            t = 1000.0
            for _ in range(n):
                t += 0.0001
                empty.chunk(None, t, TOKEN)
            return n

        def tokens(n: int = events) -> int:
            rec = LatencyRecorder(clock_s=lambda: 1000.0)
            r = _streaming(rec, 1000.0)
            t = 1000.01
            for _ in range(n):
                t += 0.0001  # 10,000 tokens a second: the slot turns over every 10,000 events
                rec.chunk(r, t, TOKEN)
            return n

        def pings(n: int = events) -> int:
            rec = LatencyRecorder(clock_s=lambda: 1000.0)
            r = _streaming(rec, 1000.0)
            t = 1000.01
            for _ in range(n):
                t += 0.0001
                rec.chunk(r, t, PING)
            return n

        def before_first_token(name: str, data: bytes, n: int = events // 10) -> None:
            """`n` requests each sent one chunk `data` before any token: its cost alone (parsed once)."""
            rec = LatencyRecorder(clock_s=lambda: 1000.0)
            reqs = []
            for i in range(n):
                r = rec.begin(1000.0 + i * 1e-4)
                rec.head(r, 1000.0 + i * 1e-4, 200, True)
                reqs.append(r)
            t0 = time.perf_counter_ns()
            for i, r in enumerate(reqs):
                rec.chunk(r, 1000.1 + i * 1e-4, data)
            out.setdefault(name, []).append((time.perf_counter_ns() - t0) / n)

        def requests(n: int = events // 10) -> int:
            rec = LatencyRecorder(clock_s=lambda: 1000.0)
            t = 1000.0
            for _ in range(n):
                t += 0.001
                r = rec.begin(t)
                rec.head(r, t, 200, True)
                rec.end(r, t + 0.0005)
            return n

        def reports(n: int = 50) -> int:
            rec = LatencyRecorder(clock_s=lambda: 1000.0)
            t = 1000.0
            for _ in range(600):  # a minute of 10 requests/s, 30 tokens each, spread latencies
                t += 0.1
                r = rec.begin(t)
                rec.head(r, t, 200, True)
                for k in range(30):
                    rec.chunk(r, t + 0.05 + 0.002 * k + (k % 7) * 0.003, TOKEN)
                rec.end(r, t + 0.2)
            t0 = time.perf_counter_ns()
            for _ in range(n):
                rec.report(t)
            out.setdefault("report()", []).append((time.perf_counter_ns() - t0) / n)
            return n

        timed("empty method call", floor)
        timed("chunk (token)", tokens)
        timed("chunk (ping)", pings)
        before_first_token("first token", TOKEN)
        before_first_token("role delta", ROLE)
        timed("request (begin, head, end)", requests)
        reports()
    return {k: (statistics.median(v), min(v)) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    rows = per_event_ns(a.events, a.rounds)
    print(f"{'event':<28} {'median ns':>10} {'min ns':>10}")
    for name, (med, low) in rows.items():
        print(f"{name:<28} {med:>10.0f} {low:>10.0f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {"events": a.events, "rounds": a.rounds, "ns": {k: {"median": m, "min": lo} for k, (m, lo) in rows.items()}}
    (RESULTS / "latency_record.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
