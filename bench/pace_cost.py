"""Cost of one `GpuShare.pace()` call that need not sleep: alone on a fresh key, and with 3
idle-but-alive peers. "tight loop": back-to-back calls (the schedule is cached for 2 ms);
"after 3 ms step": each call timed alone after a 3 ms pause (1 call in ~4 re-reads the registry);
"re-read": the cost of a call that re-reads it (cache off).

    python -m bench.pace_cost [--calls 20000]

Prints µs per call (median of 5 batches) and writes bench/results/pace_cost.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from pathlib import Path

from gpushare_tui import GpuShare
from gpushare_tui.api import SCHEDULE_REREAD_US
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.membership import Membership

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
TARGET_US = 50.0


def per_call_us(share: GpuShare, calls: int, batches: int = 5) -> float:
    out = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            share.pace()
        out.append((time.perf_counter_ns() - t0) / calls / 1000)
    return statistics.median(out)


def spaced_call_us(share: GpuShare, calls: int, gap_s: float = 0.003) -> tuple[float, float]:
    """Each call timed alone after a `gap_s` "step" (cold CPU caches); a call
    re-reads the registry only when its 10 ms cache has expired, as in a real loop of GPU steps. (mean, p99) µs."""
    out = []
    for _ in range(calls):
        time.sleep(gap_s)
        t0 = time.perf_counter_ns()
        share.pace()
        out.append((time.perf_counter_ns() - t0) / 1000)
    out.sort()
    return statistics.mean(out), out[int(len(out) * 0.99)]


def measure(calls: int) -> dict:
    key = f"pacecost-{uuid.uuid4().hex[:8]}"
    rows = {}
    peers: list[Membership] = []
    try:
        with GpuShare(weight=1, name="pace-cost", gpu_key=key) as share:
            rows["tight_loop_alone_us"] = per_call_us(share, calls)
            rows["after_3ms_step_mean_us"], rows["after_3ms_step_p99_us"] = spaced_call_us(share, min(calls, 1000))
            for i in range(3):  # alive, idle peers: members of nothing, but read every call
                m = Membership(key, 1, f"peer{i}")
                m.join()
                peers.append(m)
            share._pacer._reread_us = 0  # bench only: the cost of the calls that re-read
            mean, p99 = spaced_call_us(share, min(calls, 1000))
            rows["reread_every_call_mean_us"], rows["reread_every_call_p99_us"] = mean, p99
            share._pacer._reread_us = SCHEDULE_REREAD_US
            rows["tight_loop_3_idle_peers_us"] = per_call_us(share, calls)
            rows["after_3ms_step_3_idle_peers_mean_us"], rows["after_3ms_step_3_idle_peers_p99_us"] = spaced_call_us(
                share, min(calls, 1000)
            )
    finally:
        for m in peers:
            m.leave()
        try:
            Path(f"/dev/shm/{abi.SEGMENT_PREFIX}{key}").unlink()
        except FileNotFoundError:
            pass
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--json", default=str(RESULTS / "pace_cost.json"), help="where to write the result")
    a = ap.parse_args()
    rows = measure(a.calls)
    for k, v in rows.items():
        print(f"pace() {k.removesuffix('_us').replace('_', ' ')}: {v:.1f} µs per call (target < {TARGET_US:g})")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps({"calls": a.calls, "target_us": TARGET_US, **rows}, indent=1))


if __name__ == "__main__":
    main()
