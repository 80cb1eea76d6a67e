"""Extension 1 against a lying peer, real processes: tests/hostile_ext1_peer.py (stdlib only) writes its
own slot as no honest owner would; what we read and how we pace must hold whatever it writes."""

from __future__ import annotations

import json
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_env import start_serve

from gpushare_tui.core.host.budgets import SERVE_MODEL_MAX_AGE_S
from gpushare_tui.core.observe.accounting import BUSY_DELTA_SLACK_S
from gpushare_tui.core.registry.segment import Segment
from testkit.cli import cli_argv
from testkit.paths import REPO
from testkit.shm import shm_file
from testkit.wait import wait_for

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


WORKER = str(REPO / "tests" / "ext1_worker.py")
FLOOR = 0.10  # §5's floor for two members: min(0.10, 1/n)


def _run_per_second(result: dict, start: float, seconds: int) -> list[float]:
    """The victim's running time (its steps' work, wall clock) in each whole second from `start`."""
    out = []
    for k in range(seconds):
        lo, hi = start + k, start + k + 1
        out.append(sum(max(0.0, min(t0 + d, hi) - max(t0, lo)) for t0, d in zip(result["starts"], result["durs"])))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["priority", "toggle"])
def test_a_lying_priority_peer_leaves_our_batch_engine_the_floor_in_every_second(
    procs, gpu_key: str, mode: str
) -> None:
    """A peer publishing PRIORITY + INTERACTIVE + DEMAND with busy 0 forever (or toggling PRIORITY
    ~1,600 times a second): our batch engine (GpuShare, paced) still runs >= f of every second. It
    ran 0.0 % (forever) and 9-21 % over 10 s (toggling) before the waiting member verified the budget."""
    _, hostile_slot = start_hostile(procs, gpu_key, mode)
    start, dur = time.monotonic() + 1.5, 6
    victim = procs.start([sys.executable, WORKER, gpu_key, "1", "batch", "2", str(dur), "0", str(dur), str(start)])
    assert victim.stdout.readline().strip() == "ready", victim.stderr.read()
    out, err = victim.communicate(timeout=dur + 30)
    assert victim.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["slot"] != hostile_slot
    per_s = _run_per_second(result, start, dur)
    print(f"{mode}: run per second {[round(x, 3) for x in per_s]}")
    # The first second is a transient (measured 0.002-0.21 on 2 loaded cores): the check believes the
    # holder until our wait exceeds S_P of our windows by the slack, which an honest burst after an idle
    # spell may do too (0.2 s in against the constant liar; about 0.5 s against the toggler, whose bit our
    # reads see set ~70 % of the time). Every second after it holds the floor.
    assert min(per_s[1:]) >= FLOOR, per_s


@pytest.mark.slow
def test_a_lying_priority_peer_leaves_a_supervised_batch_engine_the_floor(procs, gpu_key: str, runtime_dir) -> None:
    """The same liar beside a supervised engine (`run`, SIGSTOP/SIGCONT): its continued time (busy_total_us,
    activity `always`) is >= f of every 2 s after the first second. It stayed stopped before."""
    start_hostile(procs, gpu_key, "priority")
    p = procs.start(
        cli_argv(
            "run",
            "--weight",
            "1",
            "--gpu-key",
            gpu_key,
            "--activity",
            "always",
            "--no-health",
            "--name",
            "victim",
            "--",
            sys.executable,
            "-c",
            "while True: pass",
        )
    )
    path = shm_file(gpu_key)

    def victim():
        with Segment.attach_readonly(path) as seg:
            return next((r for r in seg.read_slots() if r.pid and r.name == "victim"), None)

    wait_for(lambda: victim() is not None or p.poll() is not None, 30, what="the supervisor joined")
    assert p.poll() is None, p.stderr.read()
    time.sleep(1.0)  # the first second is the transient (docs/registry-abi.md §7)
    samples = []
    for _ in range(5):
        r = victim()
        assert r is not None
        samples.append((time.monotonic(), r.busy_total_us))
        time.sleep(2.0)
    rates = [(b1 - b0) / 1e6 / (t1 - t0) for (t0, b0), (t1, b1) in zip(samples, samples[1:])]
    print(f"supervised: continued fraction per 2 s {[round(x, 3) for x in rates]}")
    assert min(rates) >= FLOOR, rates
