"""Extension 1 with real processes (spec §7): a priority member preempts a batch member, a budget
overrun loses priority, and a v1 member (tests/raw_writer.py, flags 0) puts everyone back on §5
until it leaves. The engines are tests/ext1_worker.py (GpuShare + CPU steps)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import pytest
from serve_env import start_writer

from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.segment import Segment
from gpushare_tui.core.schedule import ext1 as schedule_ext1
from testkit.paths import REPO
from testkit.procs import Procs
from testkit.shm import shm_file

WORKER = str(REPO / "tests" / "ext1_worker.py")
STEP_MS = 2.0

pytestmark = pytest.mark.slow


def _start(
    procs: Procs, key: str, weight: float, klass: str, busy_s: float, idle_s: float, dur_s: float, start: float
) -> subprocess.Popen:
    p = procs.start(
        [
            sys.executable,
            WORKER,
            key,
            str(weight),
            klass,
            str(STEP_MS),
            str(busy_s),
            str(idle_s),
            str(dur_s),
            str(start),
        ]
    )
    assert p.stdout.readline().strip() == "ready", p.stderr.read()  # type: ignore[union-attr]
    return p


def _result(p: subprocess.Popen, timeout: float) -> dict:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _batch_steps_in_spells(batch: dict, inter: dict, busy_s: float, grace_s: float) -> tuple[int, int]:
    """(batch steps ending inside the interactive engine's busy spells past `grace_s`, batch steps in all)."""
    ends = batch["ends"]
    inside = sum(1 for s in inter["spells"] for t in ends if s + grace_s <= t < s + busy_s)
    return inside, len(ends)


def _stop_latencies(batch: dict, inter: dict, busy_s: float) -> list[float]:
    """Per interactive spell: how long after its start the batch engine's last step there began running
    (a step begun before the spell counts from the spell's start), + that step's work time."""
    out = []
    for s in inter["spells"]:
        steps = zip(batch["starts"], batch["durs"], strict=True)
        within = [max(t0, s) - s + d for t0, d in steps if s <= t0 + d and t0 < s + busy_s]
        out.append(max(within) if within else 0.0)
    return out


def test_a_priority_member_preempts_a_batch_member(new_gpu_key, procs: Procs, runtime_dir: str) -> None:
    key = new_gpu_key("x1p")
    start = time.monotonic() + 3.0
    busy_s, idle_s, dur = 0.15, 0.6, 6.0  # interactive busy 20 %: within its budget (share 1/2)
    b = _start(procs, key, 1, "batch", dur, 0, dur, start)
    i = _start(procs, key, 1, "interactive", busy_s, idle_s, dur, start)
    inter, batch = _result(i, dur + 30), _result(b, dur + 30)
    lat = _stop_latencies(batch, inter, busy_s)
    inside, total = _batch_steps_in_spells(batch, inter, busy_s, grace_s=0.030)
    # the batch engine stops within one step of each spell: at most one step begun after the spell's start
    # (its pace() then waits); in time, that step + REREAD_US (tolerant: steps stretch on a loaded 2-core box)
    begun = [sum(1 for t0 in batch["starts"] if s <= t0 < s + busy_s) for s in inter["spells"]]
    assert statistics.median(begun) <= 1 and sum(begun) <= 2 * len(begun), begun
    assert statistics.median(lat) <= 0.060, lat
    assert inside <= 0.05 * total, (inside, total, lat)
    # and runs the rest: the interactive engine is idle 80 % of the time
    assert total >= 0.4 * dur / (STEP_MS / 1000) * 0.3, total


def test_a_budget_overrun_loses_priority(new_gpu_key, procs: Procs, runtime_dir: str) -> None:
    key = new_gpu_key("x1b")
    start = time.monotonic() + 3.0
    dur = 5.0
    b = _start(procs, key, 1, "batch", dur, 0, dur, start)
    i = _start(procs, key, 1, "interactive", dur, 0, dur, start)  # busy all along: over its budget of 1/2
    seen_bits: set[bool] = set()
    with Segment.attach_readonly(shm_file(key)) as seg:
        while time.monotonic() < start + dur - 0.5:
            for r in seg.read_slots():
                if r.flags & abi.FLAG_INTERACTIVE and r.flags & abi.FLAG_DEMAND:
                    seen_bits.add(bool(r.flags & abi.FLAG_PRIORITY))
            time.sleep(0.05)
    inter, batch = _result(i, dur + 30), _result(b, dur + 30)
    assert False in seen_bits  # the hysteresis cleared the bit
    since = start + 1.5  # past the first budget window
    b_busy = sum(d for t, d in zip(batch["ends"], batch["durs"], strict=True) if t >= since)
    i_busy = sum(d for t, d in zip(inter["ends"], inter["durs"], strict=True) if t >= since)
    # its long-run share is bounded by its weight share (1/2, and the hysteresis band below it): batch is not starved
    assert b_busy >= 0.35 * (b_busy + i_busy), (b_busy, i_busy)


def test_a_v1_member_puts_everyone_on_section_5_until_it_leaves(new_gpu_key, procs: Procs, runtime_dir: str) -> None:
    key = new_gpu_key("x1v")
    raw = start_writer(procs, key, "1:v1-peer")  # slot 0: a v1 member (flags 0, active)
    start = time.monotonic() + 3.0
    busy_s, idle_s, dur = 0.15, 0.35, 12.0
    b = _start(procs, key, 1, "batch", dur, 0, dur, start)
    i = _start(procs, key, 1, "interactive", busy_s, idle_s, dur, start)
    modes: list[tuple[float, str, int | None]] = []
    left_at = None
    with Segment.attach_readonly(shm_file(key)) as seg:
        while time.monotonic() < start + dur - 0.3:
            t = time.monotonic()
            if left_at is None and t >= start + 5.0:
                Procs.kill(raw)  # it stops heartbeating: dead (not a member) 3 s later
                left_at = t
            d = schedule_ext1.decide(seg.read_slots(), wall_us())
            modes.append((t, d.mode, d.v1_peer))
            time.sleep(0.01)
    inter, batch = _result(i, dur + 30), _result(b, dur + 30)
    assert left_at is not None
    with_v1 = [m for t, m, _ in modes if start + 0.5 <= t < left_at]
    assert set(with_v1) == {"v1"}, set(with_v1)
    assert {p for t, m, p in modes if start + 0.5 <= t < left_at} == {0}  # the v1 peer that forces it
    after = [m for t, m, _ in modes if t >= left_at + 3.5]
    assert "priority" in after and "v1" not in after, set(after)
    # with the v1 peer: no precedence, the batch engine runs through the interactive spells (§5 windows)
    v1_spells = {"spells": [s for s in inter["spells"] if start + 0.5 <= s < left_at - busy_s]}
    inside, _ = _batch_steps_in_spells(batch, v1_spells, busy_s, grace_s=0.030)
    assert inside >= 5 * len(v1_spells["spells"]), inside
    # after it left: priority resumes, the batch engine stops in the interactive spells
    late = {"spells": [s for s in inter["spells"] if s >= left_at + 3.5]}
    inside_late, _ = _batch_steps_in_spells(batch, late, busy_s, grace_s=0.030)
    assert late["spells"] and inside_late <= 2 * len(late["spells"]), (inside_late, len(late["spells"]))
