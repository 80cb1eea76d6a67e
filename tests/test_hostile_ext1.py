"""Extension 1 against a lying peer, real processes: tests/hostile_ext1_peer.py (stdlib only) writes its
own slot as no honest owner would; what we read and how we pace must hold whatever it writes."""

from __future__ import annotations

import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_env import start_serve

from gpushare_tui.core.host.budgets import SERVE_MODEL_MAX_AGE_S
from gpushare_tui.core.observe.accounting import BUSY_DELTA_SLACK_S
from testkit.paths import REPO

HOSTILE = str(REPO / "tests" / "hostile_ext1_peer.py")
GPU_BUSY = "gpushare_gpu_busy_seconds_total"


def start_hostile(procs, key: str, mode: str, weight: float = 1.0):
    p = procs.start([sys.executable, HOSTILE, key, mode, str(weight)])
    line = p.stdout.readline()
    assert line.startswith("ready"), (line, p.stderr.read() if p.poll() is not None else "")
    return p, int(line.split()[1])


@pytest.mark.slow
def test_gpu_busy_total_never_outruns_wall_time_beside_a_jumping_peer(procs, gpu_key: str) -> None:
    """A peer whose busy_total_us jumps by 1e15 a second: `serve`'s GPU busy total rises at most as
    fast as wall time (plus the slack, once). It rose 47 s over 19.7 s (2.4x) with a per-peer cap only."""
    start_hostile(procs, gpu_key, "jump")
    _, url = start_serve(procs, "--gpu-key", gpu_key)
    samples: list[tuple[float, float]] = []
    with httpx.Client(timeout=10) as client:
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            text = client.get(url + "/metrics").text
            t = time.monotonic()
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    if s.name == GPU_BUSY and s.labels.get("gpu_key") == gpu_key:
                        samples.append((t, s.value))
            time.sleep(0.2)
    assert len(samples) >= 5, samples
    for i, (t0, v0) in enumerate(samples):
        for t1, v1 in samples[i + 1 :]:
            bound = (t1 - t0) + SERVE_MODEL_MAX_AGE_S + BUSY_DELTA_SLACK_S
            assert v1 - v0 <= bound, f"busy total rose {v1 - v0:.1f} s over {t1 - t0:.1f} s of wall time"
    assert samples[-1][1] > 0  # it did count something: the cap, not a dropped peer
