#!/usr/bin/env python3
"""Cost of `gpushare-tui serve`: scrape latency with 4 segments x 16 live peers, and its CPU when idle
and when scraped once a second.

The peers are Membership objects in this process (distinct fake pids, heartbeating), so the segments
are real and live; `serve` is a real subprocess and its CPU is read from /proc (psutil). Targets
(issue 9): scrape p99 < 20 ms, idle < 0.5 % of a core, 1 scrape/s < 1 % of a core.
Cleans up its segments. Writes JSON to bench/results/.

    python -m bench.serve_cost [--scrapes 500] [--idle-s 30] [--paced-s 60]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from gpushare_tui.core.registry.membership import Membership

RESULTS = Path(__file__).resolve().parent / "results"
FAKE_PID_BASE = 3_800_000
SEGMENTS, PEERS = 4, 16


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def _cpu_over(p: psutil.Process, seconds: float, every_s: float | None, url: str) -> float:
    """% of one core `p` used over `seconds`, scraping /metrics every `every_s` (None: idle)."""
    c0, t0 = _cpu_s(p), time.monotonic()
    n = 0
    while (now := time.monotonic()) - t0 < seconds:
        if every_s is None:
            time.sleep(min(1.0, seconds - (now - t0)))
            continue
        httpx.get(url + "/metrics", timeout=10).raise_for_status()
        n += 1
        time.sleep(max(0.0, t0 + n * every_s - time.monotonic()))
    return 100 * (_cpu_s(p) - c0) / (time.monotonic() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scrapes", type=int, default=500, help="back-to-back scrapes timed (default 500)")
    ap.add_argument("--idle-s", type=float, default=30.0, help="idle CPU window (default 30 s)")
    ap.add_argument("--paced-s", type=float, default=60.0, help="1 scrape/s CPU window (default 60 s)")
    args = ap.parse_args()

    keys = [f"bench-serve-{os.getpid()}-{i}" for i in range(SEGMENTS)]
    members: list[Membership] = []
    serve = None
    try:
        for g, key in enumerate(keys):
            for i in range(PEERS):
                m = Membership(key, float(1 + i % 3), f"peer-{g}-{i}", pid=FAKE_PID_BASE + 100 * g + i)
                m.join()
                m.mark_active()
                members.append(m)
        serve = subprocess.Popen(
            [sys.executable, "-m", "gpushare_tui", "serve", "--listen", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        m = re.search(r"(http://\S+)", serve.stderr.readline())  # type: ignore[union-attr]
        if not m:
            raise RuntimeError("serve did not start")
        url = m.group(1)
        proc = psutil.Process(serve.pid)
        body = httpx.get(url + "/metrics", timeout=10).text
        ours = {k for k in keys if f'gpushare_peers{{gpu_key="{k}"}} {float(PEERS)}' in body}
        assert ours == set(keys), "segments not as expected"
        n_segments = body.count("gpushare_peers{")
        n_lines = sum(1 for ln in body.splitlines() if ln and not ln.startswith("#"))

        rows = []
        with httpx.Client(timeout=10) as client:
            for path in ("/metrics", "/gpu/peers"):
                for _ in range(20):  # warm-up
                    client.get(url + path)
                times = []
                for _ in range(args.scrapes):
                    t0 = time.perf_counter()
                    client.get(url + path).raise_for_status()
                    times.append(1000 * (time.perf_counter() - t0))
                rows.append(
                    {
                        "what": f"GET {path} latency (ms)",
                        "n": len(times),
                        "p50": statistics.median(times),
                        "p99": _pct(times, 0.99),
                        "max": max(times),
                    }
                )
        time.sleep(2)  # let the scrape burst settle
        idle = _cpu_over(proc, args.idle_s, None, url)
        paced = _cpu_over(proc, args.paced_s, 1.0, url)
        rss_mib = proc.memory_info().rss / 2**20
    finally:
        if serve is not None:
            serve.terminate()
            try:
                serve.wait(timeout=10)
            except subprocess.TimeoutExpired:
                serve.kill()
        for mem in members:
            mem.leave()
        for key in keys:
            try:
                os.unlink(f"/dev/shm/opencoti-gpu-{key}")
            except FileNotFoundError:
                pass

    print(
        f"\ngpushare-tui serve: {SEGMENTS} segments x {PEERS} live peers (+{n_segments - SEGMENTS} other segments "
        f"on this host), {n_lines} samples per scrape, {os.cpu_count()} CPUs\n"
    )
    header = f"{'measurement':<32} {'n':>5} {'p50':>8} {'p99':>8} {'max':>8}  target"
    print(header)
    print("-" * len(header))
    for r in rows:
        target = "p99 < 20 ms" if r["what"].startswith("GET /metrics") else ""
        print(f"{r['what']:<32} {r['n']:>5} {r['p50']:>8.2f} {r['p99']:>8.2f} {r['max']:>8.2f}  {target}")
    print(f"{'CPU idle (% of a core)':<32} {'':>5} {idle:>8.3f} {'':>8} {'':>8}  < 0.5 %  ({args.idle_s:g} s)")
    print(f"{'CPU at 1 scrape/s (% of a core)':<32} {'':>5} {paced:>8.3f} {'':>8} {'':>8}  < 1 %  ({args.paced_s:g} s)")
    print(f"{'RSS after (MiB)':<32} {'':>5} {rss_mib:>8.1f}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"serve_cost-{time.strftime('%Y%m%d-%H%M%S')}.json"
    doc = {
        "segments": n_segments,
        "samples": n_lines,
        "cpus": os.cpu_count(),
        "latency": rows,
        "cpu_idle_pct": idle,
        "cpu_1hz_pct": paced,
        "idle_s": args.idle_s,
        "paced_s": args.paced_s,
        "rss_mib": rss_mib,
    }
    out.write_text(json.dumps(doc, indent=1))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
