#!/usr/bin/env python3
"""`gpushare-tui up`: restart latency and reload latency, synthetic engines and real llama-servers.

* restart: `kill -9` of an engine -> a new pid holds its slot. One `up` per kind, killed
  --restart-rounds times in a row, so the backoff doubles each round (1, 2, 4, 8 s): the table
  shows the latency, the backoff and what is left (start + join) after the backoff.
* reload: the file's weight edited + SIGHUP -> the slot's weight changed (same pid), --reload-rounds.

Prints a table and writes JSON to bench/results/up_latency.json.

    python -m bench.up_latency [--restart-rounds 4] [--reload-rounds 10] [--no-llama]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpushare_tui.core.registry.segment import Segment, SegmentError, shm_path

RESULTS = Path(__file__).resolve().parent / "results"
ENGINE = '\n[[engine]]\nname = "{name}"\nweight = {weight}\n{body}\n'


def _slots(key: str) -> dict[str, tuple[int, float]]:
    try:
        with Segment.attach_readonly(shm_path(key)) as seg:
            now = time.time_ns() // 1000
            return {r.name: (r.pid, r.weight) for r in seg.read_slots() if r.is_alive(now)}
    except (OSError, SegmentError):
        return {}


def _poll(pred, timeout: float, interval: float = 0.001):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise RuntimeError("timed out")


def _config(key: str, body: str, weight_a: float) -> str:
    return (
        f'gpu_key = "{key}"\n'
        + ENGINE.format(name="a", weight=weight_a, body=body)
        + ENGINE.format(name="b", weight=1, body=body)
    )


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def measure(kind: str, body: str, restart_rounds: int, reload_rounds: int, work: str) -> dict:
    key = f"bench-up-{os.getpid()}-{kind}"
    path = os.path.join(work, f"{kind}.toml")
    _write(path, _config(key, body, 2))
    env = {**os.environ, "XDG_STATE_HOME": os.path.join(work, "state")}
    up = subprocess.Popen(
        [sys.executable, "-m", "gpushare_tui", "up", path], env=env, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
    )
    out: dict = {"kind": kind, "reload_ms": [], "restart": []}
    try:
        _poll(lambda: len(_slots(key)) == 2, 120, 0.01)
        time.sleep(1.0)
        for i in range(reload_rounds):
            pid, _ = _slots(key)["a"]
            w = 3.0 + i
            _write(path, _config(key, body, w))
            t0 = time.perf_counter()
            up.send_signal(signal.SIGHUP)
            _poll(lambda w=w, pid=pid: _slots(key).get("a") == (pid, w), 10)
            out["reload_ms"].append((time.perf_counter() - t0) * 1000)
            time.sleep(0.2)
        for i in range(restart_rounds):
            pid, _ = _slots(key)["a"]
            t0 = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            new = _poll(lambda pid=pid: (s := _slots(key).get("a")) and s[0] != pid and s, 120)
            dt = time.perf_counter() - t0
            out["restart"].append({"round": i + 1, "backoff_s": 2.0**i, "latency_s": dt, "new_pid": new[0]})
            time.sleep(1.0)
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            up.kill()
        try:
            os.unlink(shm_path(key))
        except FileNotFoundError:
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--restart-rounds", type=int, default=4)
    ap.add_argument("--reload-rounds", type=int, default=10)
    ap.add_argument("--no-llama", action="store_true")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-up-")
    kinds = [("synth", "synth = { step_ms = 5 }")]
    server = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    if not a.no_llama and server:
        from testkit.tiny_gguf import write_tiny_llama

        model = write_tiny_llama(os.path.join(work, "tiny.gguf"), 256, 4)
        cmd = json.dumps([server, "-m", model, "-t", "1", "-c", "2048", "-np", "1"])
        kinds.append(("llama-server", f"command = {cmd}"))
    results = []
    try:
        for kind, body in kinds:
            results.append(measure(kind, body, a.restart_rounds, a.reload_rounds, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("reload latency (SIGHUP -> slot weight changed, same pid), ms")
    print(f"{'engine':<14}{'n':>4}{'median':>9}{'p90':>9}{'max':>9}")
    for r in results:
        xs = sorted(r["reload_ms"])
        p90 = xs[min(len(xs) - 1, int(len(xs) * 0.9))]
        print(f"{r['kind']:<14}{len(xs):>4}{statistics.median(xs):>9.1f}{p90:>9.1f}{xs[-1]:>9.1f}")
    print("\nrestart latency (kill -9 of the engine -> new pid holds its slot), s")
    print(f"{'engine':<14}{'round':>6}{'backoff':>9}{'latency':>9}{'after backoff':>15}")
    for r in results:
        for x in r["restart"]:
            extra = x["latency_s"] - x["backoff_s"]
            print(f"{r['kind']:<14}{x['round']:>6}{x['backoff_s']:>9.0f}{x['latency_s']:>9.2f}{extra:>15.2f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "up_latency.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
