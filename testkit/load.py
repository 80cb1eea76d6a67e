"""Streaming completion load against a llama-server, recording each token's arrival."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import httpx


class StreamLoad:
    """Back-to-back streaming /completion requests on a thread."""

    def __init__(
        self, port: int, n_predict: int = 256, host: str = "127.0.0.1", banned_tokens: Iterable[int] = ()
    ) -> None:
        self.url = f"http://{host}:{port}/completion"
        self.body = {
            "prompt": "the a of",
            "n_predict": n_predict,
            "ignore_eos": True,
            "stream": True,
            "cache_prompt": False,
            "logit_bias": [[t, False] for t in banned_tokens],
        }
        self.tokens: list[float] = []  # time.monotonic() of each streamed token
        self.request_starts: list[int] = []  # index in `tokens` of each request's first token
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> StreamLoad:
        self._thread.start()
        return self

    def stop(self, join_s: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(join_s)

    def stop_nowait(self) -> None:
        self._stop.set()

    def count(self, t0: float, t1: float) -> int:
        return sum(1 for t in self.tokens if t0 <= t < t1)

    def gaps_s(self, t0: float, t1: float) -> list[float]:
        """Gaps between consecutive tokens of one request, both in [t0, t1)."""
        starts = set(self.request_starts)
        ts = self.tokens
        return [ts[i] - ts[i - 1] for i in range(1, len(ts)) if i not in starts and t0 <= ts[i - 1] and ts[i] < t1]

    def _run(self) -> None:
        with httpx.Client(timeout=httpx.Timeout(60.0)) as c:
            while not self._stop.is_set():
                try:
                    with c.stream("POST", self.url, json=self.body) as r:
                        self.request_starts.append(len(self.tokens))
                        for line in r.iter_lines():
                            if line.startswith("data: ") and '"content"' in line:
                                self.tokens.append(time.monotonic())
                            if self._stop.is_set():
                                break
                except httpx.HTTPError:
                    time.sleep(0.05)
