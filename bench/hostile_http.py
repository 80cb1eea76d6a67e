#!/usr/bin/env python3
"""HTTP against hostile peers (issue 17): `serve` under a slowloris, `--once --remote` against a host that
drips its reply, and a scrape's latency while 8 clients scrape at once.

1. /healthz under a sustained 16-socket slowloris (each socket sends one byte and reconnects when dropped):
   the share of probes answered 200 within 1 s (target >= 95 %).
2. `--once --no-local --remote URL` against a loopback host that drips its status line and headers one
   byte every 0.5 s: the wall time (cut at --drip-cap-s).
3. /metrics latency, one client alone and 8 clients at once, with 4 segments x 16 live peers.

Cleans up its segments and processes. Prints a table; writes JSON to bench/results/.

    python -m bench.hostile_http [--probes 40] [--drip-cap-s 60]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from gpushare_tui.core.registry.membership import Membership
from testkit.http import HostileHost, slowloris

RESULTS = Path(__file__).resolve().parent / "results"
FAKE_PID_BASE = 3_900_000
SEGMENTS, PEERS = 4, 16
ATTACKERS = 16
SCRAPERS = 8


def _start_serve() -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen(
        [sys.executable, "-m", "gpushare_tui", "serve", "--listen", "127.0.0.1:0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    m = re.search(r"(http://\S+)", p.stderr.readline())  # type: ignore[union-attr]
    if not m:
        p.kill()
        raise RuntimeError("serve did not start")
    return p, m.group(1)


def _stop(p: subprocess.Popen) -> None:
    p.terminate()
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def healthz_under_slowloris(probes: int) -> dict:
    serve, url = _start_serve()
    stop = threading.Event()
    try:
        threads = slowloris(url, ATTACKERS, stop)
        time.sleep(1.0)  # the attack in place
        ok, lat = 0, []
        for _ in range(probes):
            t0 = time.monotonic()
            try:
                r = httpx.get(url + "/healthz", timeout=1.0)
                dt = time.monotonic() - t0
                if r.status_code == 200 and dt <= 1.0:
                    ok += 1
                    lat.append(1000 * dt)
            except httpx.HTTPError:
                pass
            time.sleep(max(0.0, 0.25 - (time.monotonic() - t0)))
        stop.set()
        for t in threads:
            t.join(timeout=3)
    finally:
        stop.set()
        _stop(serve)
    return {"probes": probes, "ok_within_1s": ok, "ok_pct": 100 * ok / probes, "p50_ms": _p(lat, 0.5)}


def once_remote_drip(cap_s: float) -> dict:
    host = HostileHost(drip_s=0.5)
    try:
        t0 = time.monotonic()
        try:
            r = subprocess.run(
                [sys.executable, "-m", "gpushare_tui", "--once", "--no-local", "--remote", host.url],
                capture_output=True,
                text=True,
                timeout=cap_s,
            )
            took, rc, out = time.monotonic() - t0, r.returncode, (r.stdout + r.stderr).strip()[-200:]
        except subprocess.TimeoutExpired:
            took, rc, out = time.monotonic() - t0, None, f"still running at {cap_s:g} s (killed)"
    finally:
        host.close()
    return {"wall_s": took, "rc": rc, "output": out, "cut_at_s": cap_s}


def scrape_latency(scrapes: int) -> dict:
    keys = [f"bench-hostile-http-{os.getpid()}-{i}" for i in range(SEGMENTS)]
    members: list[Membership] = []
    serve = None
    try:
        for g, key in enumerate(keys):
            for i in range(PEERS):
                m = Membership(key, float(1 + i % 3), f"peer-{g}-{i}", pid=FAKE_PID_BASE + 100 * g + i)
                m.join()
                m.mark_active()
                members.append(m)
        serve, url = _start_serve()

        def scrape_many(n: int) -> list[float]:
            out = []
            with httpx.Client(timeout=30) as c:
                for _ in range(n):
                    t0 = time.perf_counter()
                    c.get(url + "/metrics").raise_for_status()
                    out.append(1000 * (time.perf_counter() - t0))
            return out

        scrape_many(10)  # warm-up
        alone = scrape_many(scrapes)
        with ThreadPoolExecutor(SCRAPERS) as pool:
            together = [x for xs in pool.map(scrape_many, [scrapes] * SCRAPERS) for x in xs]
    finally:
        if serve is not None:
            _stop(serve)
        for mem in members:
            mem.leave()
        for key in keys:
            try:
                os.unlink(f"/dev/shm/opencoti-gpu-{key}")
            except FileNotFoundError:
                pass
    return {
        "alone_p50_ms": _p(alone, 0.5),
        "alone_p99_ms": _p(alone, 0.99),
        f"x{SCRAPERS}_p50_ms": _p(together, 0.5),
        f"x{SCRAPERS}_p99_ms": _p(together, 0.99),
        "scrapes_per_client": scrapes,
    }


def _p(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probes", type=int, default=40, help="/healthz probes under the slowloris (default 40)")
    ap.add_argument("--drip-cap-s", type=float, default=60.0, help="cut `--once --remote` at this (default 60)")
    ap.add_argument("--scrapes", type=int, default=30, help="scrapes per client (default 30)")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    doc = {
        "cpus": os.cpu_count(),
        "loadavg_1m_before": load,
        "healthz_under_slowloris": healthz_under_slowloris(args.probes),
        "once_remote_drip": once_remote_drip(args.drip_cap_s),
        "scrape_latency": scrape_latency(args.scrapes),
        "loadavg_1m_after": os.getloadavg()[0],
    }
    h, d, s = doc["healthz_under_slowloris"], doc["once_remote_drip"], doc["scrape_latency"]
    print(f"\nhostile HTTP, {os.cpu_count()} CPUs, load {load:.2f} -> {doc['loadavg_1m_after']:.2f}\n")
    print(
        f"/healthz under a {ATTACKERS}-socket slowloris: {h['ok_within_1s']}/{h['probes']} within 1 s "
        f"({h['ok_pct']:.0f} %, target >= 95 %), p50 {h['p50_ms']} ms"
    )
    print(f"--once --remote against a drip host: {d['wall_s']:.1f} s (rc {d['rc']}): {d['output']}")
    print(
        f"/metrics latency ms: alone p50 {s['alone_p50_ms']:.1f} p99 {s['alone_p99_ms']:.1f}; "
        f"{SCRAPERS} at once p50 {s[f'x{SCRAPERS}_p50_ms']:.1f} p99 {s[f'x{SCRAPERS}_p99_ms']:.1f}"
    )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"hostile_http-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(doc, indent=1))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
