"""An interactive engine's inter-token gaps as a client sees them: streamed /completion requests, one at a
time, on a cadence (tests/test_latency_class.py; self-contained, so that the test runs against older builds)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import httpx

from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS


@dataclass
class Requests:
    """Each request's token arrival times (monotonic s), in the order sent."""

    tokens_s: list[list[float]] = field(default_factory=list)
    sent_s: list[float] = field(default_factory=list)

    def gaps_ms(self) -> list[float]:
        return [(b - a) * 1000 for ts in self.tokens_s for a, b in zip(ts, ts[1:])]


def stream_requests(port: int, n: int, n_predict: int, every_s: float, seed: int = 0) -> Requests:
    """`n` streamed requests of `n_predict` tokens to `port`, one at a time, each sent `every_s` (±50 %,
    seeded) after the previous one was sent (at once when that one ran longer). A request that fails is
    an AssertionError: a gap measured around a failure would be no gap."""
    rng = random.Random(seed)
    body = {"prompt": "the a of", "n_predict": n_predict, "ignore_eos": True, "stream": True,
            "cache_prompt": False, "logit_bias": [[t, False] for t in NON_TEXT_TOKEN_IDS]}  # fmt: skip
    out = Requests()
    nxt = time.monotonic()
    with httpx.Client(timeout=120) as c:
        for _ in range(n):
            time.sleep(max(0.0, nxt - time.monotonic()))
            sent = time.monotonic()
            nxt = sent + every_s * rng.uniform(0.5, 1.5)
            ts: list[float] = []
            with c.stream("POST", f"http://127.0.0.1:{port}/completion", json=body) as r:
                assert r.status_code == 200, r.status_code
                for line in r.iter_lines():
                    if line.startswith("data: ") and '"content"' in line and '"stop":true' not in line:
                        ts.append(time.monotonic())  # a token (the closing event carries no new one)
            assert len(ts) == n_predict, (len(ts), n_predict)
            out.sent_s.append(sent)
            out.tokens_s.append(ts)
    return out


def percentile(xs: list[float], q: float) -> float:
    """The q-quantile of `xs` (nearest rank below; the largest for q = 1)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))]
