"""GPU sharing benchmark: N engine processes built on `GpuShare`, each a batch-1-decode-like,
bandwidth-bound step (a chain of matrix-vector products over its own weights, synchronised per step).

    python -m bench.gpu_share --backend torch   # CUDA: fp16 weights, --gb per engine
    python -m bench.gpu_share --backend numpy   # CPU: float32 weights, --mb per engine

Scenarios: solo, 1:1, 2:1 (then the weight-1 engine goes idle: idle release), 2/1/1 paced;
unpaced 1:1 and 2:1 (no GpuShare: the device's own time-slicing). Per engine: steps/s, step-gap
p50/p95/max; per scenario: ratio error vs the weights, aggregate as % of solo. Prints a table,
writes JSON (--json, default bench/results/gpu_share-<backend>.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SCENARIOS = ("solo", "1:1", "2:1", "2/1/1", "unpaced 1:1", "unpaced 2:1")
WARMUP_S = 1.0  # after the start, before the measurement window (every engine active, schedule built)
RELEASE_WINDOW_S = 0.5
RELEASE_SETTLE_S = 1.5


class BenchError(Exception):
    """One line for the user; exit 1."""


# -- the engine (a child process) ------------------------------------------


def make_step(backend: str, size_mib: float, dim: int):
    """A step function: one pass of x through every weight matrix, synchronised."""
    if backend == "torch":
        import torch

        if not torch.cuda.is_available():
            raise BenchError("torch sees no CUDA device (use --backend numpy on CPU)")
        layers = max(1, round(size_mib * 2**20 / (dim * dim * 2)))
        ws = [torch.empty(dim, dim, dtype=torch.float16, device="cuda").normal_(std=dim**-0.5) for _ in range(layers)]
        x0 = torch.ones(dim, dtype=torch.float16, device="cuda")

        def step() -> None:
            x = x0
            for w in ws:
                x = torch.mv(w, x)
            torch.cuda.synchronize()

        return step
    import numpy as np

    layers = max(1, round(size_mib * 2**20 / (dim * dim * 4)))
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((dim, dim), dtype=np.float32) * dim**-0.5 for _ in range(layers)]
    x0 = np.ones(dim, dtype=np.float32)

    def step() -> None:
        x = x0
        for w in ws:
            x = w @ x

    return step


def worker(a: argparse.Namespace) -> None:
    """Allocate, warm up, say "ready", wait for "go T" (a CLOCK_MONOTONIC start), step until
    T + busy_s (pacing through GpuShare unless --unpaced), stay joined but idle until T + total_s,
    then print the step end times as JSON."""
    step = make_step(a.backend, a.size_mib, a.dim)
    for _ in range(3):
        step()
    share = None
    if not a.unpaced:
        from gpushare_tui import GpuShare

        share = GpuShare(weight=a.weight, name=f"bench-w{a.weight:g}", gpu_key=a.key, control=False).open()
        if a.trim:  # the A/B of the edge trim (off in GpuShare: measured, it cost aggregate, gained no accuracy)
            share._pacer._trim = True
        diag = _instrument(share)
    print("ready", flush=True)
    line = sys.stdin.readline().split()
    t_start = float(line[1])
    while time.monotonic() < t_start:
        time.sleep(0.001)
    ends: list[float] = []
    work_s = 0.0
    try:
        while time.monotonic() < t_start + a.busy_s:
            t0 = time.monotonic()
            step()
            if t0 >= t_start + WARMUP_S:
                work_s += time.monotonic() - t0
            if share is not None:
                share.pace()
            ends.append(time.monotonic())
        left = t_start + a.total_s - time.monotonic()
        if left > 0:
            time.sleep(left)
    finally:
        if share is not None:
            share.close()
    out = {
        "ends": ends,
        "pid": os.getpid(),
        "work_s": work_s,
        "start_skew_ms": 1000 * (ends[0] - t_start) if ends else None,
    }
    if share is not None:
        out.update(late_ms=diag["late"], over_ms=diag["over"])
    print(json.dumps(out), flush=True)


def _instrument(share) -> dict:
    """Record, at each of the pacer's sleeps, how late it woke (ms past the time asked) and where the
    step that ended outside the window ended relative to the window's end (ms; < 0: stopped early)."""
    from gpushare_tui.core.host.clock import wall_us

    pacer = share._pacer
    real_sleep = pacer._sleep
    diag: dict = {"late": [], "over": []}

    def sleep(s: float) -> None:
        d = pacer.decision
        sched = d.schedule if d is not None else None
        if sched is not None and share.slot in sched.slots:
            _, end = sched.window_of(share.slot)
            x = (wall_us() % sched.period_us - end) % sched.period_us
            diag["over"].append((x - sched.period_us if x > sched.period_us / 2 else x) / 1000)
        t0 = time.monotonic()
        real_sleep(s)
        diag["late"].append((time.monotonic() - t0 - s) * 1000)

    pacer._sleep = sleep
    return diag


# -- the driver --------------------------------------------------------------


def run_engines(
    a: argparse.Namespace, key: str, weights: list[float], paced: bool, busy_s: list[float], total_s: float
) -> list[dict]:
    """Start one engine per weight, start them together, return each one's result (step end times
    from the start, `ends`; work time, start skew and, paced, the pacer's wake-ups and overshoots)."""
    procs = []
    try:
        for w, b in zip(weights, busy_s):
            argv = [sys.executable, "-m", "bench.gpu_share", "--worker", "--backend", a.backend, "--key", key]
            argv += ["--weight", str(w), "--busy-s", str(b), "--total-s", str(total_s), "--dim", str(a.dim)]
            argv += ["--size-mib", str(a.size_mib)] + ([] if paced else ["--unpaced"]) + (["--trim"] if a.trim else [])
            procs.append(
                subprocess.Popen(
                    argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_worker_env(a)
                )
            )
        for p in procs:
            if p.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
                raise BenchError(f"an engine did not start (exit {p.wait()}); its error is above")
        t_start = time.monotonic() + 0.3
        for p in procs:
            p.stdin.write(f"go {t_start}\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        out = []
        for p in procs:
            text, _ = p.communicate(timeout=total_s + 120)
            if p.returncode != 0:
                raise BenchError(f"an engine failed (exit {p.returncode}); its error is above")
            res = json.loads(text.strip().splitlines()[-1])
            res["ends"] = [t - t_start for t in res["ends"]]
            out.append(res)
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _worker_env(a: argparse.Namespace) -> dict:
    env = dict(os.environ)
    if a.backend == "numpy":  # one core per engine: the step is a single stream of work, as on a GPU
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = "1"
    return env


def rate(ends: list[float], t0: float, t1: float) -> float:
    return sum(1 for t in ends if t0 <= t < t1) / (t1 - t0)


def gaps_ms(ends: list[float], t0: float, t1: float) -> dict:
    g = sorted((b - a) * 1000 for a, b in zip(ends, ends[1:]) if t0 <= a and b < t1)
    if not g:
        return {"p50": None, "p95": None, "max": None}
    return {"p50": g[len(g) // 2], "p95": g[min(len(g) - 1, int(len(g) * 0.95))], "max": g[-1]}


def idle_release_s(ends: list[float], t_idle: float, t_end: float) -> float | None:
    """After its peer went idle at `t_idle`: when this engine first ran at >= 95% of its own
    settled rate (the last RELEASE_SETTLE_S) over a RELEASE_WINDOW_S window."""
    settled = rate(ends, t_end - RELEASE_SETTLE_S, t_end)
    t = t_idle
    while t + RELEASE_WINDOW_S <= t_end - RELEASE_SETTLE_S:
        if rate(ends, t, t + RELEASE_WINDOW_S) >= 0.95 * settled:
            return t - t_idle
        t += 0.05
    return None


def scenario(a: argparse.Namespace, name: str, solo: float | None) -> dict:
    paced = not name.startswith("unpaced")
    weights = {"solo": [1.0], "1:1": [1.0, 1.0], "2:1": [2.0, 1.0], "2/1/1": [2.0, 1.0, 1.0]}[name.split()[-1]]
    release = name == "2:1"
    end = WARMUP_S + a.seconds
    total = end + (a.release_s if release else 0.0)
    busy = [total] + [end] * (len(weights) - 1) if release else [end] * len(weights)
    key = f"bench-gs-{uuid.uuid4().hex[:8]}"
    try:
        results = run_engines(a, key, weights, paced, busy, total)
        ends = [r["ends"] for r in results]
    finally:
        try:
            os.unlink(f"/dev/shm/opencoti-gpu-{key}")
        except FileNotFoundError:
            pass
    rates = [rate(e, WARMUP_S, end) for e in ends]
    row: dict = {
        "scenario": name,
        "paced": paced,
        "weights": weights,
        "steps_per_s": rates,
        "aggregate_steps_per_s": sum(rates),
        "gaps_ms": [gaps_ms(e, WARMUP_S, end) for e in ends],
    }
    if len(weights) > 1:
        achieved = [r / rates[-1] if rates[-1] else math.inf for r in rates]
        row["ratio_achieved"] = achieved
        row["ratio_error_pct"] = max(abs(x / (w / weights[-1]) - 1) * 100 for x, w in zip(achieved, weights))
    if solo:
        row["aggregate_pct_of_solo"] = 100 * sum(rates) / solo
    row["diag"] = [_diag(r) for r in results]
    if len(weights) > 1:  # busy accounting: the ratio of work time (what the pacer counts as busy)
        work = [r["work_s"] for r in results]
        row["work_ratio"] = [x / work[-1] if work[-1] else math.inf for x in work]
    if release:
        row["idle_release_s"] = idle_release_s(ends[0], end, total)
    return row


def _diag(r: dict) -> dict:
    def mean(xs: list[float]) -> float | None:
        return statistics.fmean(xs) if xs else None

    return {
        "wake_late_ms_mean": mean(r.get("late_ms", [])),
        "overshoot_ms_mean": mean(r.get("over_ms", [])),
        "start_skew_ms": r.get("start_skew_ms"),
        "work_s": r.get("work_s"),
    }


def print_diag(rows: list[dict]) -> None:
    print("why (paced, per engine): wake-up lateness mean ms / overshoot past the window end mean ms / start skew ms")
    for r in rows:
        if not r["paced"] or len(r["weights"]) < 2:
            continue
        cells = "  ".join(
            f"{_f(d['wake_late_ms_mean'], '.2f')}/{_f(d['overshoot_ms_mean'], '.2f')}/{_f(d['start_skew_ms'], '.1f')}"
            for d in r["diag"]
        )
        work = ":".join(f"{x:.2f}" for x in r.get("work_ratio", []))
        print(f"{r['scenario']:<12} {cells}   work-time ratio {work}")


def _f(x, spec=".1f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list[dict]) -> None:
    print(
        f"{'scenario':<12} {'steps/s per engine':<24} {'ratio':<16} {'err%':>6} {'agg%solo':>9} "
        f"{'release_s':>9}  gaps p50/p95/max ms"
    )
    for r in rows:
        rates = "/".join(f"{x:.1f}" for x in r["steps_per_s"])
        ratio = ":".join(f"{x:.2f}" for x in r.get("ratio_achieved", [1.0]))
        gaps = "  ".join(f"{_f(g['p50'])}/{_f(g['p95'])}/{_f(g['max'])}" for g in r["gaps_ms"])
        print(
            f"{r['scenario']:<12} {rates:<24} {ratio:<16} {_f(r.get('ratio_error_pct')):>6} "
            f"{_f(r.get('aggregate_pct_of_solo')):>9} {_f(r.get('idle_release_s'), '.2f'):>9}  {gaps}"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("torch", "numpy"), default="numpy")
    ap.add_argument("--seconds", type=float, default=10.0, help="measurement window per scenario (after 1 s warm-up)")
    ap.add_argument("--release-s", type=float, default=6.0, help="2:1: how long to watch after the peer goes idle")
    ap.add_argument("--only", default="", help=f"comma list of scenarios besides solo ({','.join(SCENARIOS[1:])})")
    ap.add_argument("--size-mib", type=float, default=None, help="weights per engine (torch 4096, numpy 32)")
    ap.add_argument("--dim", type=int, default=None, help="matrix side (torch 8192, numpy 1024)")
    ap.add_argument("--json", default=None, help="result file (default bench/results/gpu_share-<backend>.json)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--key", help=argparse.SUPPRESS)
    ap.add_argument("--weight", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--busy-s", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--total-s", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--unpaced", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trim", action="store_true", help="pace with the edge trim (A/B; GpuShare: §5.7 literally)")
    a = ap.parse_args(argv)
    if a.size_mib is None:
        a.size_mib = 4096.0 if a.backend == "torch" else 32.0
    if a.dim is None:
        a.dim = 8192 if a.backend == "torch" else 1024
    if a.seconds <= 0 or a.release_s < RELEASE_WINDOW_S + RELEASE_SETTLE_S or a.size_mib <= 0 or a.dim <= 0:
        ap.error(f"--seconds, --size-mib and --dim must be > 0, --release-s >= {RELEASE_WINDOW_S + RELEASE_SETTLE_S}")
    unknown = set(filter(None, a.only.split(","))) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenario(s) {', '.join(sorted(unknown))} (known: {', '.join(SCENARIOS)})")
    return a


def check_backend(backend: str) -> str:
    """A one-line description of the device, or BenchError."""
    if backend == "torch":
        try:
            import torch
        except ImportError:
            raise BenchError("--backend torch: torch is not importable") from None
        if not torch.cuda.is_available():
            raise BenchError("--backend torch: torch sees no CUDA device (use --backend numpy on CPU)")
        return f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}"
    try:
        import numpy
    except ImportError:
        raise BenchError("--backend numpy: numpy is not importable (pip install numpy)") from None
    return f"numpy {numpy.__version__}, CPU ({os.cpu_count()} cores), 1 thread per engine"


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        if a.worker:
            worker(a)
            return 0
        device = check_backend(a.backend)
        names = ["solo"] + [n for n in SCENARIOS[1:] if not a.only or n in a.only.split(",")]
        rows: list[dict] = []
        solo = None
        for name in names:
            rows.append(scenario(a, name, solo))
            if name == "solo":
                solo = rows[-1]["steps_per_s"][0]
                rows[-1]["aggregate_pct_of_solo"] = 100.0
    except BenchError as e:
        print(f"gpu_share: {e}", file=sys.stderr)
        return 1
    result = {
        "backend": a.backend,
        "device": device,
        "size_mib_per_engine": a.size_mib,
        "dim": a.dim,
        "seconds": a.seconds,
        "solo_steps_per_s": solo,
        "rows": rows,
        "summary": summary(rows),
    }
    path = Path(a.json) if a.json else RESULTS / f"gpu_share-{a.backend}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"{device}; {a.size_mib:g} MiB of weights per engine, {a.seconds:g} s windows; solo {solo:.1f} steps/s")
    print_table(rows)
    print_diag(rows)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores{'; --trim' if a.trim else ''}")
    print(f"wrote {path}")
    return 0


def summary(rows: list[dict]) -> dict:
    """The issue's targets, side by side with unpaced time-slicing."""
    by = {r["scenario"]: r for r in rows}
    out = {}
    for name in ("2:1", "unpaced 2:1"):
        if name in by:
            out[f"{name} ratio_error_pct"] = by[name].get("ratio_error_pct")
            out[f"{name} aggregate_pct_of_solo"] = by[name].get("aggregate_pct_of_solo")
    if "2:1" in by:
        out["idle_release_s"] = by["2:1"].get("idle_release_s")
    paced = [r["aggregate_pct_of_solo"] for r in rows if r["paced"] and r["scenario"] != "solo"]
    if paced:
        out["paced_aggregate_pct_of_solo_median"] = statistics.median(paced)
    return out


if __name__ == "__main__":
    sys.exit(main())
