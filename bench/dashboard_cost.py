"""Dashboard refresh cost: 4 segments x 16 live peers at 1 Hz; target < 3% of one core.

A helper process owns 64 registry slots (Membership objects with distinct
fake pids, heartbeating, active, busy varying). Then the dashboard runs:

  headless  DashboardApp.run_test() in this process (layout + render, no terminal)
  tmux      the real `gpushare-tui` in a 120x40 tmux pane (everything, terminal output included)

and we report CPU seconds per wall second (% of one core) over the window,
after a warm-up. The segments are removed at the end.

The timelines animate their strobe cursor on their own timers (dashboard.strobe:
a frame every whole periods + 1/16 period, at least 250 ms apart): with 16 active
peers of weights 1-4 the period is 400 ms (2.4 frames/s per timeline). `--active 2`
keeps only two peers of each segment active, at weight 1: an 80 ms period, a frame
every 325 ms (3.1 frames/s per timeline), near the animation's worst case (4/s). Headless runs
also count the frames the visible timelines drew in the window.

    python -m bench.dashboard_cost [--seconds 30] [--mode headless|tmux|both|paired] [--active N]

`--mode paired` isolates the animation's own cost on a shared, noisy box: one
headless App, 5 s slices with the cursor animating and paused in alternation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import psutil

KEYS_N = 4
PEERS_N = 16


def _peers(keys: list[str], shm_dir: str, ready, stop, active_n: int | None = None) -> None:
    from gpushare_tui.core.registry import segment
    from gpushare_tui.core.registry.membership import Membership

    segment.SHM_DIR = shm_dir  # a private tmpfs directory: no other segments on this host in view

    members, idle = [], []  # idle: alive (heartbeating), never active, so not in the schedule
    base = 3_000_000 + random.randrange(100_000)
    for gi, key in enumerate(keys):
        for i in range(PEERS_N):
            weight = 1 + (i % 4) if active_n is None else 1
            m = Membership(key, weight, f"peer-{gi}-{i:02d}", pid=base + gi * 100 + i, log=lambda _m: None)
            m.join()
            if active_n is None or i < active_n:
                members.append(m)
            else:
                idle.append(m)
    ready.set()
    rng = random.Random(1)
    while not stop.is_set():
        for m in members:
            if active_n is not None or rng.random() < 0.9:
                m.mark_active()
            m.set_busy_ppm(rng.randrange(1_000_000))
        time.sleep(0.5)
    for m in members + idle:
        m.leave()


def start_peers(keys: list[str], shm_dir: str, active_n: int | None = None):
    ctx = mp.get_context("fork")
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_peers, args=(keys, shm_dir, ready, stop, active_n), daemon=True)
    proc.start()
    if not ready.wait(30):
        raise SystemExit("helper did not register its peers")
    return proc, stop


def _frames(app) -> int:
    """Cursor frames the App's timelines have drawn so far."""
    from gpushare_tui.widgets.timeline import Timeline

    return sum(getattr(t, "frames", 0) for t in app.query(Timeline))


def measure_headless(shm_dir: str, seconds: float, warmup: float, interval: float) -> dict:
    from gpushare_tui.app import DashboardApp
    from gpushare_tui.dashboard.source import LiveSource

    async def run() -> dict:
        app = DashboardApp(LiveSource(shm_dir=shm_dir), interval_s=interval)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(warmup)
            seen0, f0, c0, w0 = app.models_seen, _frames(app), time.process_time(), time.monotonic()
            await asyncio.sleep(seconds)
            c1, w1 = time.process_time(), time.monotonic()
            n_rows = app.query_one("#peers").row_count
            periods = sorted({g.snapshot.period_ms for g in app.model.gpus}, key=str) if app.model else []
            return {
                "cpu_s": c1 - c0,
                "wall_s": w1 - w0,
                "refreshes": app.models_seen - seen0,
                "rows": n_rows,
                "frames": _frames(app) - f0,
                "periods_ms": periods,
            }

    return asyncio.run(run())


def measure_headless_paired(shm_dir: str, seconds: float, warmup: float, interval: float, slice_s: float = 5.0):
    """The timelines' animation alone: one headless App, slices of `slice_s` with the cursor animating and
    paused (as when scrolled out of view) in alternation, so both halves see the same load on a shared box."""
    from gpushare_tui.app import DashboardApp
    from gpushare_tui.dashboard.source import LiveSource
    from gpushare_tui.widgets.timeline import Timeline

    visible = Timeline._visible
    totals = {True: [0.0, 0.0, 0, 0], False: [0.0, 0.0, 0, 0]}  # cpu s, wall s, refreshes, frames

    async def run() -> None:
        app = DashboardApp(LiveSource(shm_dir=shm_dir), interval_s=interval)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(warmup)
            animating = False
            for _ in range(max(2, round(seconds / slice_s))):
                Timeline._visible = visible if animating else (lambda self: False)  # type: ignore[method-assign]
                await asyncio.sleep(1.0)  # let the other state's timers run out
                seen0, f0, c0, w0 = app.models_seen, _frames(app), time.process_time(), time.monotonic()
                await asyncio.sleep(slice_s)
                t = totals[animating]
                t[0] += time.process_time() - c0
                t[1] += time.monotonic() - w0
                t[2] += app.models_seen - seen0
                t[3] += _frames(app) - f0
                animating = not animating
            Timeline._visible = visible  # type: ignore[method-assign]

    asyncio.run(run())
    return [
        (
            f"headless, cursor {'animating' if on else 'paused'}",
            {"cpu_s": t[0], "wall_s": t[1], "refreshes": t[2], "rows": PEERS_N * KEYS_N, "frames": t[3]},
        )
        for on, t in ((True, totals[True]), (False, totals[False]))
    ]


def measure_tmux(shm_dir: str, seconds: float, warmup: float, interval: float, size=(120, 40)) -> dict:
    """The same DashboardApp as `gpushare-tui`, in a real terminal, reading only the bench's segments."""
    if shutil.which("tmux") is None:
        return {}
    session = f"bench-{uuid.uuid4().hex[:6]}"
    code = (
        "from gpushare_tui.app import DashboardApp; from gpushare_tui.dashboard.source import LiveSource; "
        f"DashboardApp(LiveSource(shm_dir={shm_dir!r}), interval_s={interval!r}).run()"
    )
    cmd = f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", str(size[0]), "-y", str(size[1]), cmd], check=True
    )
    try:
        pane_pid = int(subprocess.check_output(["tmux", "display", "-p", "-t", session, "#{pane_pid}"]).strip())
        time.sleep(warmup)
        proc = psutil.Process(pane_pid)
        t0 = proc.cpu_times()
        w0 = time.monotonic()
        time.sleep(seconds)
        t1 = proc.cpu_times()
        w1 = time.monotonic()
        screen = subprocess.check_output(["tmux", "capture-pane", "-p", "-t", session], text=True)
        rows = sum(1 for ln in screen.splitlines() if "peer-" in ln)
        return {
            "cpu_s": (t1.user + t1.system) - (t0.user + t0.system),
            "wall_s": w1 - w0,
            "rows": rows,
            "refreshes": round((w1 - w0) / interval),
        }
    finally:
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=False)
        time.sleep(1)
        subprocess.run(["tmux", "kill-session", "-t", session], check=False, stderr=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--mode", choices=("headless", "tmux", "both", "paired"), default="both")
    ap.add_argument(
        "--active",
        type=int,
        default=None,
        metavar="N",
        help="only N peers of each segment active, weight 1 (2: an 80 ms period, the fastest cursor animation)",
    )
    args = ap.parse_args()

    tag = uuid.uuid4().hex[:6]
    keys = [f"GPU-bench-{tag}-{i}" for i in range(KEYS_N)]
    shm_dir = tempfile.mkdtemp(prefix=f"gpushare-bench-{tag}-", dir="/dev/shm")

    helper, stop = start_peers(keys, shm_dir, args.active)
    results = []
    try:
        if args.mode in ("headless", "both"):
            results.append(
                ("headless run_test 120x40", measure_headless(shm_dir, args.seconds, args.warmup, args.interval))
            )
        if args.mode == "paired":
            results += measure_headless_paired(shm_dir, args.seconds, args.warmup, args.interval)
        if args.mode in ("tmux", "both"):
            for size in ((120, 40), (80, 24)):
                results.append(
                    (
                        f"tmux {size[0]}x{size[1]} (real terminal)",
                        measure_tmux(shm_dir, args.seconds, args.warmup, args.interval, size),
                    )
                )
    finally:
        stop.set()
        helper.join(10)
        if helper.is_alive():
            helper.kill()
        shutil.rmtree(shm_dir, ignore_errors=True)

    rows = [{"mode": n, **r, "cpu_pct_of_one_core": 100 * r["cpu_s"] / r["wall_s"]} for n, r in results if r]
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, f"dashboard_cost-{time.strftime('%Y%m%d-%H%M%S')}.json")
    meta = {"segments": KEYS_N, "peers_per_segment": PEERS_N, "interval_s": args.interval, "active": args.active}
    with open(out, "w") as f:
        json.dump({**meta, "window_s": args.seconds, "cpus": os.cpu_count(), "results": rows}, f, indent=1)

    active = "all active, weights 1-4" if args.active is None else f"{args.active} active per segment, weight 1"
    print(
        f"\n{KEYS_N} segments x {PEERS_N} live peers ({active}), refresh every {args.interval:g} s, "
        f"{args.seconds:g} s window after {args.warmup:g} s warm-up; {os.cpu_count()} CPUs\n"
    )
    print(
        f"{'mode':<30} {'wall s':>7} {'cpu s':>7} {'% of 1 core':>12} {'refreshes':>10} {'rows':>5} "
        f"{'frames':>7} {'period ms':>10}  verdict"
    )
    for name, r in results:
        if not r:
            print(f"{name:<30} (skipped: tmux not installed)")
            continue
        pct = 100 * r["cpu_s"] / r["wall_s"]
        periods = ",".join(str(p) for p in r.get("periods_ms", [])) or "-"
        print(
            f"{name:<30} {r['wall_s']:>7.1f} {r['cpu_s']:>7.2f} {pct:>11.2f}% {r['refreshes']:>10} {r['rows']:>5} "
            f"{r.get('frames', '-'):>7} {periods:>10}  {'OK (< 3%)' if pct < 3 else 'OVER 3%'}"
        )
    print(f"\n(JSON: {os.path.relpath(out)})")


if __name__ == "__main__":
    main()
