#!/usr/bin/env python3
"""Wall time of `gpushare-tui --once --json` with 3 full segments (16 live peers each), against a
bare interpreter start (`python -c pass`): issue 28's target is a ratio of at most 2.5.

The peers are Membership objects in this process (distinct pid= values, unique keys,
heartbeating), so the segments are real and live; the runs get a private XDG_RUNTIME_DIR (no
other engine's control socket here makes one of them managed). Each round runs every command once,
in an order rotated round by round (paired: a load that comes and goes hits them alike); the table
gives each command's median, min and max over the rounds, the median of its per-round ratio to the
floor and its median CPU time (user + system: steadier on a loaded machine), then every round. The
package is byte-compiled first, as an installed one is (an editable checkout with
PYTHONDONTWRITEBYTECODE=1 would otherwise compile every module on every start). Then the same
report in-process (cold: a new reader each time; warm: mappings kept open).
Cleans up its segments. Writes JSON to bench/results/.

    python -m bench.once_json_wall [--rounds 15] [--instructions]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gpushare_tui
from gpushare_tui.cli import once_report
from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.observe.snapshot import SegmentReader
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.dashboard.model import unmanaged_view
from gpushare_tui.dashboard.report import ReportData, report_json

RESULTS = Path(__file__).resolve().parent / "results"
FAKE_PID_BASE = 3_900_000
TARGET_RATIO = 2.5  # issue 28 item 5
FLOOR = "python -c pass (interpreter floor)"


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run: on a loaded machine the CPU time (user + system) varies less."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    stderr = p.stderr.read() if p.stderr is not None else b""
    _pid, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv} failed: {stderr.decode(errors='replace')}")
    return wall, usage.ru_utime + usage.ru_stime


def _paired(commands: dict[str, list[str]], rounds: int, env: dict[str, str]) -> dict[str, list[tuple[float, float]]]:
    """Each command's (wall, CPU) seconds, one per round; round i starts at command i (mod n)."""
    names = list(commands)
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for n in names:  # one warm-up each (page cache, bytecode)
        _run(commands[n], env)
    for i in range(rounds):
        for n in names[i % len(names) :] + names[: i % len(names)]:
            times[n].append(_run(commands[n], env))
    return times


def _instructions(argv: list[str], env: dict[str, str]) -> int | None:
    """Instructions one run executes (valgrind's callgrind, `Collected`): the same on a loaded machine
    as on a quiet one; None without valgrind."""
    if shutil.which("valgrind") is None:
        return None
    r = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        capture_output=True,
        text=True,
        env=env,
    )
    found = [ln.split()[-1] for ln in r.stderr.splitlines() if "Collected :" in ln]
    return int(found[-1]) if r.returncode == 0 and found else None


def _time_inproc(fn, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _row(label: str, times: list[float], floor: list[float] | None = None, cpu: list[float] | None = None) -> dict:
    row: dict = {
        "what": label,
        "runs": len(times),
        "median_ms": 1000 * statistics.median(times),
        "min_ms": 1000 * min(times),
        "max_ms": 1000 * max(times),
    }
    if cpu is not None:
        row["cpu_median_ms"] = 1000 * statistics.median(cpu)
    if floor is not None:
        row["ratio_median"] = statistics.median(t / f for t, f in zip(times, floor))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", "--runs", type=int, default=15, help="paired rounds of subprocess runs (default 15)")
    ap.add_argument("--inproc-runs", type=int, default=200, help="in-process runs (default 200)")
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="also count each command's instructions under valgrind (one run each: slow, but load-independent)",
    )
    args = ap.parse_args()

    compileall.compile_dir(os.path.dirname(gpushare_tui.__file__), quiet=1)
    keys = [f"bench-once-{os.getpid()}-{i}" for i in range(3)]
    members: list[Membership] = []
    runtime = tempfile.mkdtemp(prefix="bench-once-")
    try:
        for g, key in enumerate(keys):
            for i in range(16):
                m = Membership(key, float(1 + i % 3), f"peer-{g}-{i}", pid=FAKE_PID_BASE + 100 * g + i)
                m.join()
                if i % 2 == 0:
                    m.mark_active()
                members.append(m)

        # a private runtime directory: no other engine's control socket on this host makes a peer managed
        env = {**os.environ, "XDG_RUNTIME_DIR": runtime}
        once = [sys.executable, "-m", "gpushare_tui", "--once", "--json"]
        doc = json.loads(subprocess.run(once, capture_output=True, text=True, check=True, env=env).stdout)
        ours = [g for g in doc["gpus"] if g["gpu_key"] in keys]
        assert len(ours) == 3 and all(len(g["peers"]) == 16 for g in ours), "segments not as expected"
        n_all = len(doc["gpus"])

        commands = {
            FLOOR: [sys.executable, "-c", "pass"],
            "python -c 'import gpushare_tui.cli'": [sys.executable, "-c", "import gpushare_tui.cli"],
            f"python -m gpushare_tui --once --json ({n_all} segments)": once,
            "python -m gpushare_tui --once --json --gpu-key (1 segment)": once + ["--gpu-key", keys[0]],
        }
        script = os.path.join(os.path.dirname(sys.executable), "gpushare-tui")
        if os.path.exists(script):
            commands[f"gpushare-tui --once --json ({n_all} segments, console script)"] = [script, "--once", "--json"]
        paired = _paired(commands, args.rounds, env)
        times = {n: [w for w, _c in ts] for n, ts in paired.items()}
        cpus = {n: [c for _w, c in ts] for n, ts in paired.items()}
        floor = times[FLOOR]
        rows = [_row(n, t, None if n == FLOOR else floor, cpus[n]) for n, t in times.items()]
        counted = {n: _instructions(argv, env) for n, argv in commands.items()} if args.instructions else {}
        rows.append(
            _row(
                "in-process once_report + dumps (cold reader)",
                _time_inproc(lambda: json.dumps(once_report(None)), args.inproc_runs),
            )
        )
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
        shutil.rmtree(runtime, ignore_errors=True)
        for m in members:
            m.leave()
        for key in keys:
            try:
                os.unlink(f"/dev/shm/opencoti-gpu-{key}")
            except FileNotFoundError:
                pass

    load = os.getloadavg()
    print(
        f"\n--once --json wall time: 3 segments x 16 live peers (+{n_all - 3} other segments on this host), "
        f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
        f"{args.rounds} paired rounds, target ratio <= {TARGET_RATIO}\n"
    )
    header = (
        f"{'measurement':<66} {'runs':>5} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'x floor':>8} {'cpu ms':>7}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        ratio = f"{r['ratio_median']:>8.2f}" if "ratio_median" in r else f"{'':>8}"
        cpu = f"{r['cpu_median_ms']:>7.1f}" if "cpu_median_ms" in r else ""
        spread = f"{r['median_ms']:>10.2f} {r['min_ms']:>8.2f} {r['max_ms']:>8.2f}"
        print(f"{r['what']:<66} {r['runs']:>5} {spread} {ratio} {cpu}")
    print("\nevery round, ms (x floor):")
    names = list(times)
    print("round " + " ".join(f"{'cmd ' + str(j):>15}" for j in range(len(names))))
    for i in range(args.rounds):
        cells = [
            f"{1000 * times[n][i]:>15.1f}"
            if n == FLOOR
            else f"{1000 * times[n][i]:>7.1f} ({times[n][i] / floor[i]:>4.2f}x)"
            for n in names
        ]
        print(f"{i:>5} " + " ".join(cells))
    print("\n" + "\n".join(f"cmd {j}: {n}" for j, n in enumerate(names)))
    if counted and counted[FLOOR]:
        print("\ninstructions (valgrind callgrind, one run each):")
        for n, ir in counted.items():
            cells = f"{ir / 1e6:>8.1f} M  {ir / counted[FLOOR]:>5.2f}x" if ir else "(not counted)"
            print(f"{n:<66} {cells}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"once_json_wall-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "segments": n_all,
                "cpus": os.cpu_count(),
                "loadavg": load,
                "rounds_ms": {n: [1000 * t for t in ts] for n, ts in times.items()},
                "rounds_cpu_ms": {n: [1000 * t for t in ts] for n, ts in cpus.items()},
                "rows": rows,
                "instructions": counted,
            },
            indent=1,
        )
    )
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
