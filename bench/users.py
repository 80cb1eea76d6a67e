"""Fair between users (Extension 2, spec registry-abi.md §8): configured vs accounted share per user and
per engine, with 2 and 3 real users (root, uid 65534, and uid 65533 where the host allows) running
unequal numbers of synthetic engines in one share group (`nogroup`). Needs root and setpriv.

    python -m bench.users [--rounds 3] [--seconds 8] [--step-ms 2]

Each case starts its engines (nice -10, as a supervisor's pace loop raises itself), waits until every
peer computes Extension 2 over all of them, then measures each engine's accounted busy time
(busy_total_us deltas) over `--seconds`, `--rounds` times. Prints a table (configured %: the user share
e_i of §8.3; accounted %: busy ÷ Σ busy) and writes bench/results/users.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.observe.snapshot import SegmentReader
from gpushare_tui.core.registry.segment import Segment
from testkit.cli import cli_argv
from testkit.shm import remove, shm_file, unique_key

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
GROUP = "nogroup"
USERS = {"root": None, "nobody": 65534, "uid65533": 65533}
CASES = [  # (title, [(user, weight), ...])
    ("2 users: A 3 engines, B 1", [("root", 1), ("root", 1), ("root", 1), ("nobody", 1)]),
    ("2 users: A 2,1,1, B 1", [("root", 2), ("root", 1), ("root", 1), ("nobody", 1)]),
    ("3 users: A 1, B 2 engines, C 3", [("root", 1), ("nobody", 1), ("nobody", 1)] + [("uid65533", 1)] * 3),
]


def _start(key: str, user: str, weight: float, name: str, step_ms: str) -> subprocess.Popen:
    argv = cli_argv("synth", "--weight", str(weight), "--name", name, "--gpu-key", key)
    argv += ["--share-group", GROUP, "--step-ms", step_ms, "-q"]
    uid = USERS[user]
    who = [] if uid is None else ["setpriv", "--reuid", str(uid), "--regid", "65534", "--clear-groups"]
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "XDG_STATE_HOME")}
    return subprocess.Popen(
        ["nice", "-n", "-10", *who, *argv],
        env={**env, "HOME": "/tmp"} if uid is not None else env,
        cwd="/",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _busy(key: str) -> dict[int, int]:
    with Segment.attach_readonly(shm_file(key)) as seg:
        return {r.pid: r.busy_total_us for r in seg.read_slots() if r.pid}


def _run_case(title: str, engines: list[tuple[str, float]], rounds: int, seconds: float, step_ms: str) -> dict:
    key = unique_key("busr")
    procs: list[subprocess.Popen] = []
    try:
        procs.append(_start(key, *engines[0], "e0", step_ms))
        deadline = time.monotonic() + 60
        while not os.path.exists(shm_file(key)) and time.monotonic() < deadline:
            time.sleep(0.1)
        procs += [_start(key, u, w, f"e{i}", step_ms) for i, (u, w) in enumerate(engines[1:], 1)]
        pids = [p.pid for p in procs]
        reader = SegmentReader(key)
        snap = None
        while time.monotonic() < deadline:
            gpus = reader.read_all(wall_us()).gpus
            snap = gpus[0] if gpus else None
            if snap and snap.users_applied and {p.pid for p in snap.peers if p.share_pct > 0} == set(pids):
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"{title}: Extension 2 never applied ({snap.users_fallback if snap else 'no segment'})")
        by_pid = {p.pid: p for p in snap.peers}
        configured = [by_pid[p].user_share_pct or 0.0 for p in pids]
        time.sleep(1.0)
        measured = []
        for _ in range(rounds):
            b0 = _busy(key)
            time.sleep(seconds)
            b1 = _busy(key)
            d = [b1[p] - b0[p] for p in pids]
            measured.append([100.0 * x / sum(d) for x in d])
        return {"title": title, "users": [u for u, _ in engines], "weights": [w for _, w in engines],
                "configured_pct": configured, "accounted_pct": measured,
                "load_1m": float(open("/proc/loadavg").read().split()[0])}  # fmt: skip
    finally:
        for p in procs:
            p.kill()
            p.wait()
        remove(shm_file(key))


def _table(results: list[dict]) -> str:
    lines = []
    for r in results:
        lines.append(f"{r['title']}  (load {r['load_1m']:.1f})")
        lines.append(f"  {'user':<9} {'engine':>6} {'weight':>6} {'config%':>8} " + " ".join(
            f"{'round' + str(k + 1):>7}" for k in range(len(r["accounted_pct"]))))  # fmt: skip
        for i, (u, w) in enumerate(zip(r["users"], r["weights"], strict=True)):
            rounds = " ".join(f"{m[i]:7.1f}" for m in r["accounted_pct"])
            lines.append(f"  {u:<9} {i:>6} {w:>6g} {r['configured_pct'][i]:8.1f} {rounds}")
        for u in dict.fromkeys(r["users"]):
            idx = [i for i, x in enumerate(r["users"]) if x == u]
            conf = sum(r["configured_pct"][i] for i in idx)
            rounds = " ".join(f"{sum(m[i] for i in idx):7.1f}" for m in r["accounted_pct"])
            lines.append(f"  {u:<9} {'all':>6} {'':>6} {conf:8.1f} {rounds}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--step-ms", default="2")
    ap.add_argument("--cases", default="", help="comma-separated case numbers (default: all)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench.users needs root (its users are setpriv'd)")
    chosen = [CASES[int(i)] for i in a.cases.split(",")] if a.cases else CASES
    results = [_run_case(t, e, a.rounds, a.seconds, a.step_ms) for t, e in chosen]
    print(_table(results))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "users.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
