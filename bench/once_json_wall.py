#!/usr/bin/env python3
"""Wall time of `gpushare-tui --once --json` with 3 full segments (16 live peers each).

The peers are Membership objects in this process (distinct pid= values, unique keys,
heartbeating), so the segments are real and live. Times the CLI end to end in a
subprocess (median of --runs) next to the interpreter start-up it cannot avoid, and
the same report in-process (cold: a new reader each time; warm: mappings kept open).
Cleans up its segments. Writes JSON to bench/results/.

    python -m bench.once_json_wall [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gpushare_tui.cli import once_report
from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.observe.snapshot import SegmentReader
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.dashboard.model import unmanaged_view
from gpushare_tui.dashboard.report import ReportData, report_json

RESULTS = Path(__file__).resolve().parent / "results"
FAKE_PID_BASE = 3_900_000


def _time_subprocess(argv: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run(argv, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise RuntimeError(f"{argv} failed: {r.stderr}")
    return times


def _time_inproc(fn, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _row(label: str, times: list[float]) -> dict:
    return {
        "what": label,
        "runs": len(times),
        "median_ms": 1000 * statistics.median(times),
        "min_ms": 1000 * min(times),
        "max_ms": 1000 * max(times),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10, help="subprocess runs per measurement (default 10)")
    ap.add_argument("--inproc-runs", type=int, default=200, help="in-process runs (default 200)")
    args = ap.parse_args()

    keys = [f"bench-once-{os.getpid()}-{i}" for i in range(3)]
    members: list[Membership] = []
    try:
        for g, key in enumerate(keys):
            for i in range(16):
                m = Membership(key, float(1 + i % 3), f"peer-{g}-{i}", pid=FAKE_PID_BASE + 100 * g + i)
                m.join()
                if i % 2 == 0:
                    m.mark_active()
                members.append(m)

        doc = json.loads(
            subprocess.run(
                [sys.executable, "-m", "gpushare_tui", "--once", "--json"], capture_output=True, text=True, check=True
            ).stdout
        )
        ours = [g for g in doc["gpus"] if g["gpu_key"] in keys]
        assert len(ours) == 3 and all(len(g["peers"]) == 16 for g in ours), "segments not as expected"
        n_all = len(doc["gpus"])

        rows = [
            _row("python -c pass (interpreter floor)", _time_subprocess([sys.executable, "-c", "pass"], args.runs)),
            _row(
                "python -c 'import gpushare_tui.cli'",
                _time_subprocess([sys.executable, "-c", "import gpushare_tui.cli"], args.runs),
            ),
            _row(
                f"gpushare-tui --once --json ({n_all} segments)",
                _time_subprocess([sys.executable, "-m", "gpushare_tui", "--once", "--json"], args.runs),
            ),
            _row(
                "gpushare-tui --once --json --gpu-key (1 segment)",
                _time_subprocess(
                    [sys.executable, "-m", "gpushare_tui", "--once", "--json", "--gpu-key", keys[0]], args.runs
                ),
            ),
            _row(
                "in-process once_report + dumps (cold reader)",
                _time_inproc(lambda: json.dumps(once_report(None)), args.inproc_runs),
            ),
        ]
        reader = SegmentReader()
        try:

            def warm() -> None:
                now = wall_us()
                gpus, errors = reader.read(now)
                views = [(None, unmanaged_view(g)) for g in gpus]
                json.dumps(report_json(ReportData("host", now, views, [(None, e) for e in errors])))

            warm()
            rows.append(_row("in-process read + dumps (warm reader)", _time_inproc(warm, args.inproc_runs)))
        finally:
            reader.close()
    finally:
        for m in members:
            m.leave()
        for key in keys:
            try:
                os.unlink(f"/dev/shm/opencoti-gpu-{key}")
            except FileNotFoundError:
                pass

    print(
        f"\n--once --json wall time: 3 segments x 16 live peers (+{n_all - 3} other segments on this host), "
        f"{os.cpu_count()} CPUs\n"
    )
    header = f"{'measurement':<52} {'runs':>5} {'median ms':>10} {'min ms':>8} {'max ms':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['what']:<52} {r['runs']:>5} {r['median_ms']:>10.2f} {r['min_ms']:>8.2f} {r['max_ms']:>8.2f}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"once_json_wall-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"segments": n_all, "cpus": os.cpu_count(), "rows": rows}, indent=1))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
