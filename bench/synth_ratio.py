#!/usr/bin/env python3
"""Weighted sharing with synthetic engines: solo (unpaced / paced), 2:1, 1:1, 2:1:1.

Each scenario starts real `gpushare-tui synth` processes on a fresh key with the same
fixed --work-units, lets them run --duration seconds, and measures steps/s of each
over the same window after a --warmup (from the engines' --status-file samples).
Prints a table and writes JSON to bench/results/.

    python -m bench.synth_ratio [--duration 10] [--warmup 2] [--step-ms 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpushare_tui.core.engines.synthetic import calibrate_units

RESULTS = Path(__file__).resolve().parent / "results"

# name, weights, paced
SCENARIOS: list[tuple[str, list[str], bool]] = [
    ("solo unpaced", ["1"], False),
    ("solo paced", ["1"], True),
    ("2:1 paced", ["2", "1"], True),
    ("1:1 paced", ["1", "1"], True),
    ("2:1:1 paced", ["2", "1", "1"], True),
    ("2:1 unpaced", ["2", "1"], False),
]


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def _wait_sample(path: str, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while (d := _read(path)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no status from {path}")
        time.sleep(0.05)
    return d


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            os.kill(p.pid, signal.SIGTERM)  # leaves its slot
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()


def run_scenario(
    name: str, weights: list[str], paced: bool, units: int, duration: float, warmup: float, tmp: str
) -> dict:
    key = f"bench-{os.getpid()}-{name.replace(' ', '-').replace(':', '_')}"
    procs: list[subprocess.Popen] = []
    statuses = [os.path.join(tmp, f"{key}-{i}.json") for i in range(len(weights))]
    try:
        for w, st in zip(weights, statuses, strict=True):
            argv = [
                sys.executable,
                "-m",
                "gpushare_tui",
                "synth",
                "--weight",
                w,
                "--gpu-key",
                key,
                "--work-units",
                str(units),
                "--status-file",
                st,
                "-q",
            ]
            if not paced:
                argv.append("--no-pace")
            procs.append(
                subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        for st in statuses:
            _wait_sample(st)
        t0 = time.monotonic()
        time.sleep(warmup)
        first = [_wait_sample(st) for st in statuses]
        time.sleep(max(0.0, duration - (time.monotonic() - t0)))
        last = [_wait_sample(st) for st in statuses]
    finally:
        _stop(procs)
        try:
            os.unlink(f"/dev/shm/opencoti-gpu-{key}")
        except FileNotFoundError:
            pass
    rates = [
        (b["steps_total"] - a["steps_total"]) / ((b["time_us"] - a["time_us"]) / 1e6)
        for a, b in zip(first, last, strict=True)
    ]
    window_s = min((b["time_us"] - a["time_us"]) / 1e6 for a, b in zip(first, last, strict=True))
    return {
        "scenario": name,
        "weights": [float(w) for w in weights],
        "paced": paced,
        "steps_per_s": rates,
        "aggregate_steps_per_s": sum(rates),
        "window_s": window_s,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per scenario (default 10)")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds excluded at the start (default 2)")
    ap.add_argument("--step-ms", type=float, default=5.0, help="work per step, calibrated once (default 5)")
    ap.add_argument("--units", type=int, default=0, help="fixed work units per step (default: calibrate)")
    ap.add_argument("--only", default="", help="comma-separated scenario names to run")
    args = ap.parse_args()

    units = args.units or calibrate_units(args.step_ms)
    chosen = [s for s in SCENARIOS if not args.only or s[0] in args.only.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="synth-ratio-") as tmp:
        for name, weights, paced in chosen:
            print(f"running {name} ({args.duration:g} s) ...", file=sys.stderr, flush=True)
            results.append(run_scenario(name, weights, paced, units, args.duration, args.warmup, tmp))

    solo = next((r["steps_per_s"][0] for r in results if r["scenario"] == "solo unpaced"), None)
    print(
        f"\nsynthetic engines, {units} work units/step (~{args.step_ms:g} ms), "
        f"window {args.duration - args.warmup:g} s after {args.warmup:g} s warm-up, {os.cpu_count()} CPUs\n"
    )
    header = (
        f"{'scenario':<14} {'weights':<9} {'steps/s each':<26} {'aggregate':>9} {'% solo':>7}  {'ratio':<15} target"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        rates = r["steps_per_s"]
        weights = r["weights"]
        agg = r["aggregate_steps_per_s"]
        pct = f"{100 * agg / solo:6.1f}%" if solo else "      -"
        if len(rates) == 1:
            ratio, target = "-", ("≥ 95% of unpaced" if r["paced"] else "baseline")
        else:
            ratio = ":".join(f"{x / rates[-1]:.2f}" for x in rates)
            want = ":".join(f"{w / weights[-1]:g}" for w in weights)
            err = max(abs((x / rates[-1]) / (w / weights[-1]) - 1) for x, w in zip(rates, weights, strict=True))
            r["max_ratio_error"] = err
            target = f"{want} ± 10% (err {100 * err:.1f}%)" if r["paced"] else "(no pacing: no weighting)"
        r["pct_of_solo"] = 100 * agg / solo if solo else None
        print(
            f"{r['scenario']:<14} {':'.join(f'{w:g}' for w in weights):<9} "
            f"{' / '.join(f'{x:.1f}' for x in rates):<26} {agg:9.1f} {pct:>7}  {ratio:<15} {target}"
        )

    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"synth_ratio-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "units": units,
                "step_ms": args.step_ms,
                "duration_s": args.duration,
                "warmup_s": args.warmup,
                "cpus": os.cpu_count(),
                "results": results,
            },
            indent=1,
        )
    )
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
