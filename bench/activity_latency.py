"""How fast a supervisor raises `active` after an idle llama-server starts decoding.

    python -m bench.activity_latency [--trials 10]

Prints min/median/max ms from sending a request to seeing active=1 in the slot.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx

from bench.pacing import CLI, engine_argv, llama_server_path
from gpushare_tui.core.engines.llama_server import free_port
from gpushare_tui.core.registry.segment import Segment, shm_path
from testkit.tiny_gguf import write_tiny_llama

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    a = ap.parse_args()
    model = ROOT / "bench" / "results" / "model-256x4.gguf"
    model.parent.mkdir(parents=True, exist_ok=True)
    if not model.exists():
        write_tiny_llama(str(model), 256, 4)
    key = f"act-{uuid.uuid4().hex[:8]}"
    port = free_port()
    engine = engine_argv(llama_server_path(), str(model), 1, 2048, port)
    argv = [*CLI, "launch", "--json", "--gpu-key", key, "--", *engine]
    info = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    pid = info["engine_pid"]
    lat_ms = []
    try:
        with Segment.attach_readonly(shm_path(key)) as seg, httpx.Client(timeout=60) as c:

            def active() -> bool:
                return any(r.pid == pid and r.active for r in seg.read_slots())

            for _ in range(a.trials):
                while active():  # wait for the 2 s activity window to close
                    time.sleep(0.05)
                time.sleep(0.3)
                body = {"prompt": "the", "n_predict": 2000, "ignore_eos": True}
                url = f"http://127.0.0.1:{info['port']}/completion"
                req = threading.Thread(target=c.post, args=(url,), kwargs={"json": body}, daemon=True)
                t0 = time.monotonic()
                req.start()
                while not active() and time.monotonic() - t0 < 5:
                    time.sleep(0.001)
                lat_ms.append((time.monotonic() - t0) * 1000)
                req.join()
    finally:
        subprocess.run([*CLI, "stop", str(pid)], capture_output=True, timeout=60)
        Path(shm_path(key)).unlink(missing_ok=True)
    print(
        f"active raised after first request: n={len(lat_ms)} min {min(lat_ms):.0f} ms, "
        f"median {statistics.median(lat_ms):.0f} ms, max {max(lat_ms):.0f} ms"
    )
    print("each trial (ms):", " ".join(f"{x:.0f}" for x in lat_ms))


if __name__ == "__main__":
    main()
