#!/usr/bin/env python3
"""Accounting truth check: two synth engines sharing one key, weights 2:1 with changes in between
(2:1, then 1:1, then 1:2 ... one phase each), for --duration seconds. Every --interval it scrapes a real
`gpushare-tui serve` and prints, per interval and per phase, the configured share (the schedule's window
shares) against the accounted one (Δ gpushare_peer_busy_seconds_total of each ÷ their sum), and the
busy counters' total against the wall time × busy fraction (both engines always have work: one of them
is saturated all the time, so the fraction is 1).

Targets (issue 21): accounted shares within 2 points of the schedule's; Σ busy within 3 % of elapsed.

    python -m bench.accounting [--duration 180] [--interval 15] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpushare_tui.core.pacing import control
from gpushare_tui.core.registry import abi
from gpushare_tui.core.schedule import v1 as schedule

RESULTS = Path(__file__).resolve().parent / "results"
PHASES = [(2.0, 1.0), (1.0, 1.0), (1.0, 2.0), (2.0, 1.0)]  # (weight a, weight b), one phase each in turn
SHARE_TARGET_PTS = 2.0
BUSY_TARGET_PCT = 3.0


@dataclass(frozen=True)
class Scrape:
    t_s: float  # monotonic, when the reply came
    busy_s: dict[str, float]  # gpushare_peer_busy_seconds_total by engine name
    written_s: dict[str, float]  # when each counter was written: t_s less its heartbeat age (same slot write)
    gpu_busy_s: float
    sources: str


def scrape(url: str, key: str) -> Scrape:
    """One /metrics scrape of `key`'s engines."""
    text = httpx.get(url + "/metrics", timeout=10).text
    t = time.monotonic()
    busy: dict[str, float] = {}
    age: dict[str, float] = {}
    gpu = 0.0
    sources = set()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("gpu_key") != key:
                continue
            if s.name == "gpushare_peer_busy_seconds_total":
                busy[s.labels["name"]] = s.value
                sources.add(s.labels["source"])
            elif s.name == "gpushare_peer_heartbeat_age_seconds":
                age[s.labels["name"]] = s.value
            elif s.name == "gpushare_gpu_busy_seconds_total":
                gpu = s.value
    return Scrape(t, busy, {n: t - age.get(n, 0.0) for n in busy}, gpu, ",".join(sorted(sources)))


def window_share_pct(wa: float, wb: float) -> float:
    """Engine a's window share (spec §5, the share floor included), in %."""
    sched = schedule.build_schedule([(0, wa), (1, wb)])
    assert sched is not None
    start, end = sched.window_of(0) or (0, 0)
    return 100.0 * (end - start) / sched.period_us


def start_serve(key: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen(
        [sys.executable, "-m", "gpushare_tui", "serve", "--listen", "127.0.0.1:0", "--gpu-key", key],
        stderr=subprocess.PIPE,
        text=True,
    )
    line = p.stderr.readline()  # type: ignore[union-attr]
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        raise RuntimeError(f"serve did not start: {line!r}")
    return p, m.group(1)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            os.kill(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run(duration_s: float, interval_s: float, step_ms: float) -> dict:
    key = f"bench-acct-{os.getpid()}"
    procs: list[subprocess.Popen] = []
    rows: list[dict] = []
    try:
        engines = {}
        for name, w in (("a", PHASES[0][0]), ("b", PHASES[0][1])):
            argv = [sys.executable, "-m", "gpushare_tui", "synth", "--gpu-key", key, "--weight", str(w)]
            p = subprocess.Popen([*argv, "--name", name, "--step-ms", str(step_ms), "-q"], stdout=subprocess.DEVNULL)
            procs.append(p)
            engines[name] = p
        serve, url = start_serve(key)
        procs.append(serve)
        deadline = time.monotonic() + 60
        while True:  # both engines joined and busy
            sc = scrape(url, key)
            if sc.busy_s.keys() >= {"a", "b"} and min(sc.busy_s.values()) > 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"engines did not start: {sc.busy_s}")
            time.sleep(0.2)
        phase_s = duration_s / len(PHASES)
        per_phase = max(1, round(phase_s / interval_s))
        interval_s = phase_s / per_phase
        t_start = time.monotonic()
        for i, (wa, wb) in enumerate(PHASES):
            if i:
                for name, w in (("a", wa), ("b", wb)):
                    control.request(engines[name].pid, "set_weight", weight=w)
            time.sleep(1.0)  # the new weights reach every peer at its next re-read (heartbeats: 0.5 s)
            first = prev = scrape(url, key)
            for j in range(per_phase):
                target_t = t_start + i * phase_s + (j + 1) * interval_s
                time.sleep(max(0.0, target_t - time.monotonic()))
                cur = scrape(url, key)
                rows.append(_row(f"{i + 1}.{j + 1}", wa, wb, prev, cur))
                prev = cur
            rows.append(_row(f"phase {i + 1}", wa, wb, first, prev))
        whole = [r for r in rows if r["interval"].startswith("phase")]
        rows.append(_total(whole))
    finally:
        _stop(procs)
        try:
            os.unlink(f"/dev/shm/{abi.SEGMENT_PREFIX}{key}")
        except FileNotFoundError:
            pass
    return {"duration_s": duration_s, "interval_s": interval_s, "step_ms": step_ms, "rows": rows}


def _row(label: str, wa: float, wb: float, a: Scrape, b: Scrape) -> dict:
    """One interval: Δ counters over the scrapes (raw), and each engine's busy fraction over the span
    between its counter's two writes (aligned: a counter is written at heartbeats, up to 0.5 s before
    a scrape, so a raw Δ over a short interval is off by up to 0.5 s)."""
    d = {n: b.busy_s[n] - a.busy_s[n] for n in ("a", "b")}
    frac = {n: d[n] / max(1e-9, b.written_s[n] - a.written_s[n]) for n in ("a", "b")}
    elapsed = b.t_s - a.t_s
    conf = window_share_pct(wa, wb)
    raw = 100.0 * d["a"] / (d["a"] + d["b"]) if d["a"] + d["b"] > 0 else float("nan")
    aligned = 100.0 * frac["a"] / (frac["a"] + frac["b"]) if frac["a"] + frac["b"] > 0 else float("nan")
    return {
        "interval": label,
        "weights": f"{wa:g}:{wb:g}",
        "configured_a_pct": conf,
        "accounted_a_pct": raw,
        "aligned_a_pct": aligned,
        "error_pts": raw - conf,
        "aligned_error_pts": aligned - conf,
        "elapsed_s": elapsed,
        "busy_sum_s": d["a"] + d["b"],
        "busy_vs_elapsed_pct": 100.0 * (d["a"] + d["b"]) / elapsed - 100.0,
        "aligned_busy_pct": 100.0 * (frac["a"] + frac["b"]) - 100.0,
        "gpu_busy_s": b.gpu_busy_s - a.gpu_busy_s,
        "sources": b.sources,
    }


def _total(phases: list[dict]) -> dict:
    """The whole run: every phase's busy time against the time-weighted configured share."""
    el = sum(r["elapsed_s"] for r in phases)
    busy = sum(r["busy_sum_s"] for r in phases)
    a = sum(r["busy_sum_s"] * r["accounted_a_pct"] / 100 for r in phases)
    conf = sum(r["configured_a_pct"] * r["elapsed_s"] for r in phases) / el
    return {
        "interval": "all",
        "weights": "-",
        "configured_a_pct": conf,
        "accounted_a_pct": 100 * a / busy,
        "aligned_a_pct": float("nan"),
        "error_pts": 100 * a / busy - conf,
        "aligned_error_pts": float("nan"),
        "elapsed_s": el,
        "busy_sum_s": busy,
        "busy_vs_elapsed_pct": 100.0 * busy / el - 100.0,
        "aligned_busy_pct": float("nan"),
        "gpu_busy_s": sum(r["gpu_busy_s"] for r in phases),
        "sources": phases[-1]["sources"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=180.0, help="seconds in all (default 180)")
    ap.add_argument("--interval", type=float, default=15.0, help="seconds per printed interval (default 15)")
    ap.add_argument("--step-ms", type=float, default=5.0, help="the synth engines' CPU work per step")
    ap.add_argument("--quick", action="store_true", help="40 s in all, 10 s intervals")
    args = ap.parse_args()
    duration, interval = (40.0, 10.0) if args.quick else (args.duration, args.interval)
    if not (duration > 0 and interval > 0):
        print("bench.accounting: --duration and --interval must be > 0", file=sys.stderr)
        sys.exit(2)
    load = os.getloadavg()
    res = run(duration, interval, args.step_ms)
    res["loadavg_before"] = load
    res["loadavg_after"] = os.getloadavg()
    print(f"accounting: 2 synth engines, {duration:g} s, load average {load[0]:.1f} before, "
          f"{res['loadavg_after'][0]:.1f} after ({os.cpu_count()} cores)")  # fmt: skip
    head = f"{'interval':<9} {'weights':>7} {'conf a%':>8} {'acct a%':>8} {'err pts':>8} {'aligned':>8} "
    head += f"{'err pts':>8} {'elapsed':>8} {'Σbusy s':>8} {'Σbusy-el%':>9} {'aligned':>8} {'gpu busy':>8} source"
    print(head)
    for r in res["rows"]:
        print(
            f"{r['interval']:<9} {r['weights']:>7} {r['configured_a_pct']:>8.2f} {r['accounted_a_pct']:>8.2f} "
            f"{r['error_pts']:>+8.2f} {r['aligned_a_pct']:>8.2f} {r['aligned_error_pts']:>+8.2f} "
            f"{r['elapsed_s']:>8.2f} {r['busy_sum_s']:>8.2f} {r['busy_vs_elapsed_pct']:>+9.2f} "
            f"{r['aligned_busy_pct']:>+8.2f} {r['gpu_busy_s']:>8.2f} {r['sources']}"
        )
    phases = [r for r in res["rows"] if r["interval"].startswith("phase")]
    worst_share = max(abs(r["error_pts"]) for r in phases)
    worst_busy = max(abs(r["busy_vs_elapsed_pct"]) for r in phases)
    print(
        f"per phase: worst share error {worst_share:.2f} pts (target {SHARE_TARGET_PTS:g}), "
        f"worst Σbusy vs elapsed {worst_busy:.2f} % (target {BUSY_TARGET_PCT:g}); "
        "aligned: over the spans between the counters' writes (scrape time less heartbeat age)"
    )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"accounting-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
