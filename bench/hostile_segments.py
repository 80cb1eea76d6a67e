"""Readers under a flood of hostile segments (issue 17): `--once --json`, `serve /metrics` and the dashboard.

Floods: N valid-looking foreign segments (uid 65534, 16 live peers each, heartbeats refreshed by an
"attacker" process every 2 s, 2.9 s ahead as the spec allows), or N torn ones (static, every slot's
seqlock word odd). Our own engine (a real Membership) is in a segment whose name sorts last.

Everything lives in a private directory under /dev/shm (removed at the end); the CLI runs in a private
mount namespace where that directory is bind-mounted over /dev/shm (root: `unshare -m`), the headless
dashboard reads it as its shm_dir. Runs whatever `gpushare_tui` is on PYTHONPATH (before/after).

usage: python bench/hostile_segments.py [--rounds 2] [--scenarios live:10000,torn:60,live:2000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import uuid

FOREIGN_UID = 65534
HEADER = struct.pack("<8sIIII40x", b"OCGPU\0\0\0", 1, 16, 128, 64)
OWN_KEY = "zz-bench-ours"
ONCE_TIMEOUT_S = 60.0
METRICS_TIMEOUT_S = 15.0
DASH_TIMEOUT_S = 45.0


def slots_bytes(hb_us: int, seq: int) -> bytes:
    out = bytearray(16 * 128)
    for i in range(16):
        struct.pack_into("<IIqfIqI48s", out, i * 128, 5_000_000 + i, seq, 1, 1.0, 1, hb_us, 500_000, b"flood%d" % i)
    return bytes(out)


def now_us() -> int:
    return time.time_ns() // 1000


def make_flood(d: str, n: int, kind: str) -> None:
    body = HEADER + slots_bytes(now_us() + 2_900_000, 3 if kind == "torn" else 2) + bytes(4096 - 64 - 16 * 128)
    for j in range(n):
        p = os.path.join(d, f"opencoti-gpu-0000-hostile-{j:06d}")
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, body)
        os.fchown(fd, FOREIGN_UID, FOREIGN_UID)
        os.close(fd)


REFRESHER = r"""
import os, struct, sys, time
d = sys.argv[1]
paths = [os.path.join(d, n) for n in os.listdir(d) if n.startswith("opencoti-gpu-0000-hostile-")]
while True:
    out = bytearray(16 * 128)
    hb = time.time_ns() // 1000 + 2_900_000
    for i in range(16):
        struct.pack_into("<IIqfIqI48s", out, i * 128, 5_000_000 + i, 2, 1, 1.0, 1, hb, 500_000, b"flood%d" % i)
    for p in paths:
        try:
            fd = os.open(p, os.O_WRONLY)
            os.pwrite(fd, bytes(out), 64)
            os.close(fd)
        except OSError:
            pass
    time.sleep(2.0)
"""


def in_namespace(d: str, argv: list[str]) -> list[str]:
    """argv run with `d` bind-mounted over /dev/shm in a private mount namespace."""
    return ["unshare", "-m", "sh", "-c", 'mount --bind "$0" /dev/shm && exec "$@"', d, *argv]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpushare_tui", *args]


RSS_WRAPPER = (
    "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
    "print('maxrss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
    "sys.exit(r.returncode)"
)


def measure_once(d: str) -> dict:
    """Wall time, peak RSS (via a wrapper: its only child) and size of `--once --json`; is our row in it?"""
    t0 = time.monotonic()
    argv = in_namespace(d, [sys.executable, "-c", RSS_WRAPPER, *cli("--once", "--json")])
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=ONCE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return {"once_s": f">{ONCE_TIMEOUT_S:.0f}", "once_rss_mib": "?", "once_json_mb": "?", "once_ours": False}
    wall = time.monotonic() - t0
    rss = [ln.split()[1] for ln in err.decode().splitlines() if ln.startswith("maxrss_kib ")]
    ours = False
    try:
        doc = json.loads(out)
        ours = any(g["gpu_key"] == OWN_KEY and g["peers"] for g in doc["gpus"])
    except ValueError:
        pass
    return {
        "once_s": round(wall, 2),
        "once_rss_mib": round(int(rss[-1]) / 1024) if rss else "?",
        "once_json_mb": round(len(out) / 1e6, 2),
        "once_ours": ours,
        "rc": p.returncode,
    }


def measure_serve(d: str, scrapes: int = 3) -> dict:
    import httpx

    p = subprocess.Popen(
        in_namespace(d, cli("serve", "--listen", "127.0.0.1:0")),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        line = p.stderr.readline()  # type: ignore[union-attr]
        url = line.split("listening on ", 1)[1].split()[0]
        lat, ours = [], False
        for _ in range(scrapes):
            t0 = time.monotonic()
            try:
                r = httpx.get(url + "/metrics", timeout=METRICS_TIMEOUT_S)
                lat.append(time.monotonic() - t0)
                ours = ours or (r.status_code == 200 and OWN_KEY in r.text)
            except httpx.HTTPError:
                lat.append(float("inf"))
        shown = [f"{x:.2f}" if x != float("inf") else "none" for x in lat]
        return {"metrics_s": "/".join(shown), "metrics_ours": ours}
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


DASH = r"""
import asyncio, json, sys, time
from gpushare_tui.app import DashboardApp
from gpushare_tui.dashboard.source import LiveSource
d, own, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])

async def run():
    t_start = time.monotonic()
    app = DashboardApp(LiveSource(shm_dir=d), interval_s=1.0)
    async with app.run_test(size=(120, 40)) as pilot:
        first_own = None
        last_seen, last_t, gaps = app.models_seen, time.monotonic(), []
        keys = []
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            await asyncio.sleep(0.05)
            t = time.monotonic()
            if app.models_seen != last_seen:
                gaps.append(t - last_t)
                last_seen, last_t = app.models_seen, t
            if first_own is None and app.model is not None and app.model.gpu(own) is not None:
                first_own = t - t_start
            if len(keys) < 5 and int(t * 2) % 2 == 0:
                k0 = time.monotonic()
                await pilot.press("down")
                keys.append(time.monotonic() - k0)
        gaps.append(time.monotonic() - last_t)  # the gap still open at the end
        print(json.dumps({"first_own_s": first_own, "refreshes": len(gaps) - 1, "max_gap_s": max(gaps),
                          "key_max_s": max(keys) if keys else None}), flush=True)

asyncio.run(run())
"""


def measure_dashboard(d: str, seconds: float = 8.0) -> dict:
    p = subprocess.Popen(
        [sys.executable, "-c", DASH, d, OWN_KEY, str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, _ = p.communicate(timeout=DASH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return {"dash_first_own_s": f">{DASH_TIMEOUT_S:.0f}", "dash_max_gap_s": "frozen", "dash_key_max_s": "?"}
    try:
        r = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"dash_first_own_s": "crash", "dash_max_gap_s": "?", "dash_key_max_s": "?"}
    fmt = lambda x: "never" if x is None else round(x, 2)  # noqa: E731
    return {
        "dash_first_own_s": fmt(r["first_own_s"]),
        "dash_max_gap_s": fmt(r["max_gap_s"]),
        "dash_key_max_s": fmt(r["key_max_s"]),
    }


def run_scenario(kind: str, n: int, surfaces: set[str]) -> dict:
    from gpushare_tui.core.registry import segment
    from gpushare_tui.core.registry.membership import Membership

    d = os.path.join("/dev/shm", f"gpushare-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(d)
    os.chmod(d, 0o1777)
    refresher = None
    try:
        make_flood(d, n, kind)
        if kind == "live":
            refresher = subprocess.Popen(["/usr/bin/python3", "-I", "-c", REFRESHER, d], user=FOREIGN_UID, cwd="/")
        segment.SHM_DIR = d
        with Membership(OWN_KEY, 1.0, "ours", heartbeat_s=0.5):
            row: dict = {"flood": f"{n} {kind}"}
            if "once" in surfaces:
                row |= measure_once(d)
            if "serve" in surfaces:
                row |= measure_serve(d)
            if "dash" in surfaces:
                row |= measure_dashboard(d)
        return row
    finally:
        if refresher is not None:
            refresher.terminate()
            refresher.wait()
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--scenarios", default="live:10000:once+serve+dash,torn:60:once+serve+dash,live:2000:dash")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (unshare -m, foreign-owned files)")
    rows = []
    for rnd in range(1, a.rounds + 1):
        for sc in a.scenarios.split(","):
            kind, n, surf = sc.split(":")
            row = {"round": rnd, **run_scenario(kind, int(n), set(surf.split("+")))}
            print(json.dumps(row), flush=True)
            rows.append(row)
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols and k != "rc"]
    print()
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
