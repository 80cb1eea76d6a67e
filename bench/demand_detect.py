"""How to know a llama-server's work in flight (spec §7 DEMAND) within a few ms of a request's arrival and end:
probing its /metrics fast (requests_processing > 0), or a front proxy on its public port that sees each
request start and finish (gpushare_tui/core/engines/front_proxy.py). Both against one real llama-server.

    python -m bench.demand_detect [--trials 8] [--cadences 5,10,20,50] [--idle-s 3] [--n-predict 64]

Per probe cadence: the CPU the probing costs while the engine is idle (the prober's thread and the
engine's extra CPU, in % of one core), the engine's decode rate while probed (vs not probed), and the
detection latency: request sent -> a probe answer showing requests_processing > 0 (start), and the
stream's last byte at the client -> a probe answer showing 0 (end). For the proxy: the same detection
latencies (request sent -> the proxy's DEMAND rise; last byte -> its fall), the time it adds to TTFT and
to each streamed token's gap (proxied vs direct requests, alternating), and its CPU (idle, per request,
per streamed token). Writes bench/results/demand_detect.json.

Measured here, 2026-12-02 (2 cores shared with 7 other engineers' jobs: load average 7-13; 256x4 model,
1 thread; 8 and 12 requests per row; two rounds, the second below, the first in parentheses):
  probe  5 ms: idle 25.6 % of a core (22.6) + 4.7 % engine; start p50 19.8 ms (98), end p50 5.8 ms (6.2)
  probe 10 ms: idle 16.7 % (17.2) + 3.0 %;  start p50 20.0 ms (90), end p50 4.6 ms (3.6)
  probe 20 ms: idle 10.7 % (10.3) + 2.0 %;  start p50 24.4 ms (35), end p50 13.9 ms (8.6)
  probe 50 ms: idle  4.7 % (5.3)  + 1.3 %;  start p50 39.7 ms (47), end p50 16.4 ms (16.6)
  front proxy: idle 0 %; start p50 4.3 ms (2.8), end -0.6 ms (-0.9: before the client read its last byte);
               +5.4 ms TTFT (+25.8; noise at this load), +0.0 ms per token gap, 115 µs (231) CPU per token
Probing is answered by the engine's inference loop between batches, so a busy engine answers late (start
tails of 0.3-1 s) and every probe costs decode throughput; a stopped (SIGSTOP) engine answers nothing at
all. The proxy sees a request the moment its head arrives, even while the engine is stopped, costs nothing
while idle, and gives exact per-request timings: it is the choice (core/engines/front_proxy.py).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench.pacing import end, llama_server_path, start_plain
from gpushare_tui.core.engines.front_proxy import FrontProxy
from gpushare_tui.core.engines.llama_server import parse_metrics
from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS, write_tiny_llama

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


class ProxyProcess:
    """core/engines/front_proxy.FrontProxy in a process of its own (`python -m bench.demand_detect --proxy-to PORT`):
    its port, and its DEMAND changes (CLOCK_MONOTONIC is one clock for every process)."""

    def __init__(self, upstream_port: int) -> None:
        argv = [sys.executable, "-m", "bench.demand_detect", "--proxy-to", str(upstream_port)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.pid = self.proc.pid
        self.changes: list[tuple[float, bool]] = []

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self.proc.communicate("\n", timeout=30)  # a line on stdin: print the changes and exit
        self.changes = [(float(t), up == "1") for t, up in (line.split() for line in out.splitlines() if line)]


def serve_proxy(upstream_port: int) -> None:
    with FrontProxy(("127.0.0.1", 0), ("127.0.0.1", upstream_port)) as proxy:
        print(proxy.port, flush=True)
        sys.stdin.readline()
        changes = list(proxy.demand_changes)
    print("\n".join(f"{t!r} {int(up)}" for t, up in changes), flush=True)


def thread_cpu_s(native_id: int | None) -> float:
    """CPU seconds (user + system) of one thread of this process."""
    for t in psutil.Process().threads():
        if t.id == native_id:
            return t.user_time + t.system_time
    return 0.0


def proc_cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


@dataclass
class Stream:
    """One streamed completion as the client saw it (monotonic seconds)."""

    sent_s: float
    tokens_s: list[float] = field(default_factory=list)
    end_s: float = 0.0

    @property
    def ttft_ms(self) -> float:
        return (self.tokens_s[0] - self.sent_s) * 1000 if self.tokens_s else float("nan")

    def gaps_ms(self) -> list[float]:
        return [(b - a) * 1000 for a, b in zip(self.tokens_s, self.tokens_s[1:])]

    def tok_s(self) -> float:
        span = self.tokens_s[-1] - self.tokens_s[0] if len(self.tokens_s) > 1 else 0.0
        return (len(self.tokens_s) - 1) / span if span > 0 else float("nan")


def stream_once(client: httpx.Client, port: int, n_predict: int) -> Stream:
    body = {
        "prompt": "the a of",
        "n_predict": n_predict,
        "ignore_eos": True,
        "stream": True,
        "cache_prompt": False,
        "logit_bias": [[t, False] for t in NON_TEXT_TOKEN_IDS],
    }
    s = Stream(time.monotonic())
    with client.stream("POST", f"http://127.0.0.1:{port}/completion", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                s.tokens_s.append(time.monotonic())
    s.end_s = time.monotonic()
    return s


class Prober:
    """GET /metrics every `cadence_s` (keep-alive); each answer's (arrival time, requests_processing)."""

    def __init__(self, port: int, cadence_s: float) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.cadence_s = cadence_s
        self.answers: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.native_id: int | None = None

    def __enter__(self) -> Prober:
        self._thread.start()
        while self.native_id is None:
            time.sleep(0.001)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        self.native_id = threading.get_native_id()
        with httpx.Client(timeout=5) as c:
            nxt = time.monotonic()
            while not self._stop.is_set():
                try:
                    rp = parse_metrics(c.get(self.url).text).requests_processing
                    self.answers.append((time.monotonic(), rp))
                except httpx.HTTPError:
                    pass
                nxt += self.cadence_s
                time.sleep(max(0.0, nxt - time.monotonic()))

    def seen(self, after_s: float, busy: bool) -> float | None:
        """The first answer at or after `after_s` that shows the engine busy (or idle)."""
        return next((t for t, rp in self.answers if t >= after_s and (rp > 0) == busy), None)


def _p(xs: list[float], q: float) -> float:
    xs = sorted(x for x in xs if x == x)
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else float("nan")


def _med(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def idle_cpu_pct(engine_pid: int, thread_id: int | None, seconds: float, base_engine_pct: float) -> tuple[float, float]:
    """(% of a core used by `thread_id`, extra % used by the engine over its idle baseline) over `seconds`."""
    c0, e0, t0 = thread_cpu_s(thread_id), proc_cpu_s(engine_pid), time.monotonic()
    time.sleep(seconds)
    dt = time.monotonic() - t0
    return 100 * (thread_cpu_s(thread_id) - c0) / dt, 100 * (proc_cpu_s(engine_pid) - e0) / dt - base_engine_pct


def trials(client: httpx.Client, port: int, n: int, n_predict: int, rng: random.Random) -> list[Stream]:
    out = []
    for _ in range(n):
        time.sleep(rng.uniform(0.15, 0.35))  # idle between requests: the probe's phase is random
        out.append(stream_once(client, port, n_predict))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--cadences", default="5,10,20,50", help="probe periods in ms")
    ap.add_argument("--idle-s", type=float, default=3.0)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=str(RESULTS / "demand_detect.json"))
    ap.add_argument("--proxy-to", type=int, help=argparse.SUPPRESS)  # the proxy's own process
    a = ap.parse_args()
    if a.proxy_to:
        serve_proxy(a.proxy_to)
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    model = RESULTS / f"model-{a.embd}x{a.layers}.gguf"
    if not model.exists():
        write_tiny_llama(str(model), a.embd, a.layers)
    rng = random.Random(20)
    eng = start_plain(llama_server_path(), str(model), 1.0, a.threads, 2048)
    rows: list[dict] = []
    load = psutil.getloadavg()[0]
    try:
        with httpx.Client(timeout=60) as client:
            stream_once(client, eng.port, 8)  # warm-up
            e0, t0 = proc_cpu_s(eng.pid), time.monotonic()
            time.sleep(a.idle_s)
            base_engine_pct = 100 * (proc_cpu_s(eng.pid) - e0) / (time.monotonic() - t0)
            direct = trials(client, eng.port, a.trials, a.n_predict, rng)
            base_tok_s = _med([s.tok_s() for s in direct])
            rows.append(
                {"how": "none (no probe, no proxy)", "idle_cpu_pct": 0.0, "engine_extra_cpu_pct": 0.0,
                 "tok_s": base_tok_s, "ttft_ms": _med([s.ttft_ms for s in direct])}
            )  # fmt: skip
            for cadence_ms in (float(x) for x in a.cadences.split(",")):
                with Prober(eng.port, cadence_ms / 1000) as pr:
                    time.sleep(0.2)
                    cpu, extra = idle_cpu_pct(eng.pid, pr.native_id, a.idle_s, base_engine_pct)
                    streams = trials(client, eng.port, a.trials, a.n_predict, rng)
                starts = [((pr.seen(s.sent_s, True) or float("nan")) - s.sent_s) * 1000 for s in streams]
                ends = [((pr.seen(s.end_s, False) or float("nan")) - s.end_s) * 1000 for s in streams]
                tok = _med([s.tok_s() for s in streams])
                rows.append(
                    {"how": f"probe /metrics every {cadence_ms:g} ms", "idle_cpu_pct": cpu,
                     "engine_extra_cpu_pct": extra,
                     "start_p50_ms": _med(starts), "start_max_ms": _p(starts, 1.0), "end_p50_ms": _med(ends),
                     "end_max_ms": _p(ends, 1.0), "tok_s": tok, "tok_s_cost_pct": 100 * (1 - tok / base_tok_s),
                     "ttft_ms": _med([s.ttft_ms for s in streams])}
                )  # fmt: skip
            with ProxyProcess(eng.port) as proxy:  # its own process, as it would run beside the supervisor's loop
                time.sleep(0.1)
                c0, t0 = proc_cpu_s(proxy.pid), time.monotonic()
                time.sleep(a.idle_s)
                cpu = 100 * (proc_cpu_s(proxy.pid) - c0) / (time.monotonic() - t0)
                c0 = proc_cpu_s(proxy.pid)
                via, plain = [], []
                for _ in range(a.trials):  # alternating: the machine's load drifts alike for both
                    time.sleep(rng.uniform(0.15, 0.35))
                    via.append(stream_once(client, proxy.port, a.n_predict))
                    time.sleep(rng.uniform(0.15, 0.35))
                    plain.append(stream_once(client, eng.port, a.n_predict))
                proxy_cpu_s = proc_cpu_s(proxy.pid) - c0
            changes = proxy.changes
            rises = [t for t, up in changes if up]
            falls = [t for t, up in changes if not up]
            starts = [
                ((next((t for t in rises if t >= s.sent_s - 0.001), float("nan"))) - s.sent_s) * 1000 for s in via
            ]
            # the fall after each request's rise (it may come before the client thread has read the last byte)
            ends = [((next((t for t in falls if t >= s.sent_s), float("nan"))) - s.end_s) * 1000 for s in via]
            n_tok = sum(len(s.tokens_s) for s in via)
            gap_via, gap_plain = (
                _med([g for s in via for g in s.gaps_ms()]),
                _med([g for s in plain for g in s.gaps_ms()]),
            )
            rows.append(
                {"how": "front proxy (own process)", "idle_cpu_pct": cpu, "engine_extra_cpu_pct": 0.0,
                 "start_p50_ms": _med(starts), "start_max_ms": _p(starts, 1.0), "end_p50_ms": _med(ends),
                 "end_max_ms": _p(ends, 1.0), "tok_s": _med([s.tok_s() for s in via]),
                 "tok_s_cost_pct": 100 * (1 - _med([s.tok_s() for s in via]) / _med([s.tok_s() for s in plain])),
                 "ttft_ms": _med([s.ttft_ms for s in via]),
                 "added_ttft_ms": _med([s.ttft_ms for s in via]) - _med([s.ttft_ms for s in plain]),
                 "added_gap_ms": gap_via - gap_plain,
                 "cpu_ms_per_request": 1000 * proxy_cpu_s / len(via),
                 "cpu_us_per_token": 1e6 * proxy_cpu_s / max(1, n_tok)}
            )  # fmt: skip
    finally:
        end([eng])
    meta = {"load_avg_1m": load, "cpus": psutil.cpu_count(), "trials": a.trials, "n_predict": a.n_predict,
            "model": f"{a.embd}x{a.layers}", "threads": a.threads}  # fmt: skip
    Path(a.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, allow_nan=True))
    print_table(rows, meta)


def _f(x: object, spec: str = ".1f") -> str:
    return "-" if x is None or (isinstance(x, float) and x != x) else format(x, spec)


def print_table(rows: list[dict], meta: dict) -> None:
    print(
        f"DEMAND detection: one llama-server ({meta['model']}, {meta['threads']} thread), {meta['trials']} streamed "
        f"requests of {meta['n_predict']} tokens per row; load avg {meta['load_avg_1m']:.1f} on {meta['cpus']} CPUs"
    )
    head = ("how", "idle CPU%", "engine +CPU%", "start p50/max ms", "end p50/max ms", "tok/s", "tok/s cost%", "TTFT ms")
    print(f"{head[0]:<36} " + " ".join(f"{h:>16}" for h in head[1:]))
    for r in rows:
        start = f"{_f(r.get('start_p50_ms'))}/{_f(r.get('start_max_ms'))}" if "start_p50_ms" in r else "-"
        endt = f"{_f(r.get('end_p50_ms'))}/{_f(r.get('end_max_ms'))}" if "end_p50_ms" in r else "-"
        cells = (_f(r["idle_cpu_pct"], ".2f"), _f(r["engine_extra_cpu_pct"], ".2f"), start, endt, _f(r["tok_s"]),
                 _f(r.get("tok_s_cost_pct")), _f(r.get("ttft_ms")))  # fmt: skip
        print(f"{r['how']:<36} " + " ".join(f"{c:>16}" for c in cells))
    proxy = rows[-1]
    print(
        f"proxy: +{_f(proxy['added_ttft_ms'], '.2f')} ms TTFT, +{_f(proxy['added_gap_ms'], '.3f')} ms per token gap, "
        f"{_f(proxy['cpu_ms_per_request'], '.2f')} ms CPU per request, "
        f"{_f(proxy['cpu_us_per_token'], '.0f')} µs CPU per token"
    )


if __name__ == "__main__":
    main()
