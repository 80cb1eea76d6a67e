"""Synthetic engine: real CPU work per "decode step", paced like an LLM engine."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..pacer import Pacer
from ..registry import Membership

_BLOCK = b"\x5a" * 4096


def work(units: int) -> None:
    """`units` SHA-256 passes over 4 KiB: deterministic CPU work."""
    h = hashlib.sha256()
    for _ in range(units):
        h.update(_BLOCK)


def calibrate_units(step_ms: float) -> int:
    """Units that take about `step_ms` on this machine, unpaced."""
    n = 16
    while True:
        t0 = time.perf_counter()
        work(n)
        dt = time.perf_counter() - t0
        if dt > 0.02:
            return max(1, round(n * step_ms / 1000 / dt))
        n *= 2


@dataclass
class SynthStats:
    steps_total: int = 0
    steps_per_s: float = 0.0
    started_us: int = 0
    slept_us: int = 0
    slot: int | None = None
    state: str = "running"


@dataclass(frozen=True)
class DutyPattern:
    """Busy for busy_s, then idle for idle_s, repeating (idle_s == 0: always busy)."""

    busy_s: float = 0.0
    idle_s: float = 0.0

    def busy_at(self, t_s: float) -> bool:
        if self.idle_s <= 0:
            return True
        return t_s % (self.busy_s + self.idle_s) < self.busy_s


def _write_status(path: str, data: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def run_synth(
    membership: Membership,
    *,
    step_ms: float = 5.0,
    duration_s: float = 0.0,
    pace: bool = True,
    pattern: DutyPattern = DutyPattern(),
    status_file: str | None = None,
    report: Callable[[str], None] | None = None,
    units: int | None = None,
) -> SynthStats:
    """Run until `duration_s` (0 = forever). Reports steps/s once a second."""
    units = units or calibrate_units(step_ms)
    pacer = Pacer(membership)
    stats = SynthStats(started_us=time.time_ns() // 1000, slot=membership.slot)
    t0 = last_t = time.monotonic()
    last_steps = 0
    report = report or (lambda line: print(line, flush=True))
    while duration_s <= 0 or time.monotonic() - t0 < duration_s:
        now = time.monotonic()
        if pattern.busy_at(now - t0):
            s0 = time.perf_counter_ns()
            work(units)
            stats.steps_total += 1
            if pace:
                pacer.step_done((time.perf_counter_ns() - s0) // 1000)
            else:
                membership.mark_active()
        else:
            time.sleep(0.05)
        now = time.monotonic()
        if now - last_t >= 1.0:
            stats.steps_per_s = (stats.steps_total - last_steps) / (now - last_t)
            stats.slept_us = pacer.total_slept_us
            stats.slot = membership.slot
            last_t, last_steps = now, stats.steps_total
            report(f"synth {os.getpid()}: {stats.steps_per_s:.1f} steps/s "
                   f"(slot {stats.slot}, weight {membership.weight:g}, total {stats.steps_total})")
            if status_file:
                _write_status(status_file, {"pid": os.getpid(), "time_us": time.time_ns() // 1000,
                                            "units": units, **stats.__dict__})
    if status_file:
        stats.state = "exited"
        _write_status(status_file, {"pid": os.getpid(), "time_us": time.time_ns() // 1000,
                                    "units": units, **stats.__dict__})
    return stats

