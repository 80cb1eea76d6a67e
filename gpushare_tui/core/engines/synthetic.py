"""Synthetic engine: real CPU work per "decode step", paced like an LLM engine, and its life
as a process (`serve_synth`: join, control socket, run, leave)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..host import paths
from ..host.clock import mono_us
from ..host.errors import GpushareError
from ..host.lifecycle import exit_on_termination, termination_deferred
from ..host.text import counted
from ..observe.snapshot import runs_alone
from ..pacing.control import StatusReply
from ..pacing.rate import StepRate
from ..pacing.share import GpuShare
from ..registry import abi
from ..registry.ownership import Owner

_BLOCK = b"\x5a" * 4096


def work(units: int) -> None:
    """`units` SHA-256 passes over 4 KiB: deterministic CPU work."""
    h = hashlib.sha256()
    for _ in range(units):
        h.update(_BLOCK)


# The work per step, by default: step_ms at this fixed rate, the same in every process on every host, so
# the TOK/S of two synthetic engines compare (each calibrating itself, on a loaded machine, they differed
# 3.75x). About 2.5 µs a unit on an x86 core with SHA extensions (400/ms measured), 5-10 µs without.
REFERENCE_UNITS_PER_MS = 200


def step_units(step_ms: float, work_units: int | None = None) -> int:
    """The units of work per step: `work_units` when > 0; 0: calibrated to take `step_ms` here (it
    varies with the machine and its load); None: `step_ms` at REFERENCE_UNITS_PER_MS."""
    if work_units is None:
        return max(1, round(step_ms * REFERENCE_UNITS_PER_MS))
    return work_units or calibrate_units(step_ms)


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
    steps_per_s: float = 0.0  # over the last second, idle time included (the status file's rate)
    tok_s: float | None = None  # StepRate.rate: over the last complete window of work; None until one
    solo_tok_s: float | None = None  # StepRate.solo: the best rate reached as the only active member
    started_us: int = 0  # wall clock, for readers of the status file
    started_mono_us: int = 0  # uptime: a wall-clock step must not change it
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


class StatusFileError(GpushareError, RuntimeError):
    """The status file could not be written; the message names it."""


def _write_status(path: str, data: dict) -> None:
    """Atomic replace (paths.replace_file: a new file of ours, never written through a link someone
    planted); a signal meanwhile takes effect after it (no temporary file left)."""
    with termination_deferred():
        try:
            paths.replace_file(path, json.dumps(data).encode())
        except OSError as e:
            raise StatusFileError(f"cannot write status file {path}: {e.strerror or e}") from None


def run_synth(
    share: GpuShare,
    *,
    step_ms: float = 5.0,
    duration_s: float = 0.0,
    pace: bool = True,
    pattern: DutyPattern = DutyPattern(),
    status_file: str | None = None,
    report: Callable[[str], None] | None = None,
    units: int | None = None,
    stats: SynthStats | None = None,
    stop: threading.Event | None = None,
) -> SynthStats:
    """Run until `duration_s` (0 = forever) or `stop` is set. Reports steps/s once a second.

    `status_file` gets the stats once a second and a last time however the loop ends, with
    `state` then "exited" (duration over or `stop` set), "terminated" (SystemExit or
    KeyboardInterrupt: a signal) or "failed" (any other error). StatusFileError if it
    cannot be written.
    """
    units = step_units(step_ms, units)
    membership = share.membership
    stats = stats or SynthStats()
    stats.started_us, stats.started_mono_us, stats.slot = time.time_ns() // 1000, mono_us(), membership.slot
    stop = stop or threading.Event()
    t0 = last_t = time.monotonic()
    last_steps = 0
    report = report or (lambda line: print(line, flush=True))
    rate = StepRate()
    final = "failed"

    def alone() -> bool:
        return runs_alone(membership.read_slots(), membership.slot, time.time_ns() // 1000)

    try:
        while (duration_s <= 0 or time.monotonic() - t0 < duration_s) and not stop.is_set():
            now = time.monotonic()
            if pattern.busy_at(now - t0):
                s0 = time.perf_counter_ns()
                work(units)
                stats.steps_total += 1
                if pace:
                    share.pace((time.perf_counter_ns() - s0) // 1000)
                else:
                    share.active()
                rate.update(time.monotonic(), stats.steps_total, alone)
                stats.tok_s, stats.solo_tok_s = rate.rate, rate.solo
            else:
                if stats.tok_s != 0.0 or membership.active:  # entering an idle spell: say so at once
                    rate.idle()
                    stats.tok_s = rate.rate
                    if not membership.interactive:  # an interactive one's busy is its budget's (the pacer's)
                        membership.set_busy_ppm(0)
                    share.idle()  # DEMAND (spec §7) and `active` drop at once
                time.sleep(0.05)
            now = time.monotonic()
            if now - last_t >= 1.0:
                stats.steps_per_s = (stats.steps_total - last_steps) / (now - last_t)
                stats.slept_us = share.slept_us
                stats.slot = membership.slot
                last_t, last_steps = now, stats.steps_total
                report(
                    f"synth {os.getpid()}: {stats.steps_per_s:.1f} steps/s "
                    f"(slot {stats.slot}, weight {membership.weight:g}, total {stats.steps_total})"
                )
                if status_file:
                    _write_status(
                        status_file,
                        {"pid": os.getpid(), "time_us": time.time_ns() // 1000, "units": units, **stats.__dict__},
                    )
        final = "exited"
    except (SystemExit, KeyboardInterrupt):
        final = "terminated"
        raise
    finally:
        stats.state = final
        if status_file:
            try:
                _write_status(
                    status_file,
                    {"pid": os.getpid(), "time_us": time.time_ns() // 1000, "units": units, **stats.__dict__},
                )
            except StatusFileError:
                if final == "exited":
                    raise  # else the error already on its way out is the one to report
    return stats


def synth_status(stats: SynthStats) -> dict:
    """The StatusReply fields a synthetic engine reports itself (the rest come from GpuShare)."""
    return {
        "state": stats.state,
        "tok_s": stats.tok_s,
        "solo_tok_s": stats.solo_tok_s,
        "uptime_s": (mono_us() - stats.started_mono_us) / 1e6,
    }


def output_log() -> str | None:
    """The path of the file this process's stderr (else stdout) goes to, when that is a regular
    file (the demo's and `up`'s engine logs; its path still when it has been deleted, so a
    reader can say so); None for a terminal, a pipe or /dev/null."""
    for fd in (2, 1):
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        return path.removesuffix(" (deleted)") if st.st_nlink == 0 else path
    return None


class _SynthShare(GpuShare):
    """The synthetic engine's GpuShare: its status tells the run's `stats` and log, a stop marks
    them exiting, and `owner` (`up`, when it owns the engine) hears of a stop first."""

    def __init__(
        self,
        stats: SynthStats,
        owner: Owner | None,
        key: str,
        weight: float,
        name: str,
        share_group: str | None,
        klass: str = "batch",
    ) -> None:
        super().__init__(
            weight, name, gpu_key=key, share_group=share_group, kind="synth", model="synthetic", klass=klass
        )
        self._stats = stats
        self._owner = owner

    def status(self) -> StatusReply:
        return replace(super().status(), **synth_status(self._stats), log=output_log())

    def stop(self) -> str:
        self._stats.state = "exiting"
        return super().stop()


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def serve_synth(
    key: str,
    weight: float,
    name: str = "synth",
    *,
    share_group: str | None = None,
    step_ms: float = 5.0,
    duration_s: float = 0.0,
    pace: bool = True,
    pattern: DutyPattern = DutyPattern(),
    status_file: str | None = None,
    report: Callable[[str], None] | None = None,
    units: int | None = None,
    say: Callable[[str], None] = _say,
    owner: Owner | None = None,
    klass: str = "batch",
) -> SynthStats:
    """A synthetic engine's whole life in this process: join `key`, serve the control socket,
    `run_synth` (see there), leave. Returns when the run ends (duration, `stop` request, Ctrl-C).

    GpushareError before joining if no control socket can be bound here (ControlError) or no
    slot can be had (RegistryFullError, SegmentError); a ControlError or StatusFileError later
    is raised after leaving. SIGTERM/SIGHUP become SystemExit(128 + signum), SIGINT a
    KeyboardInterrupt (it returns), at any moment (one during the start-up once it has joined), and
    however it ends, neither the slot nor the socket file is left behind. `klass`: its latency class (spec §7).
    """
    exit_on_termination()
    stats = SynthStats()
    share = _SynthShare(stats, owner, key, weight, name, share_group, klass)
    try:
        with termination_deferred():  # the start-up: a signal meanwhile ends it once joined (then `finally`)
            share.open()  # binds the control socket too: a ControlError here leaves nothing behind
            say(
                f"gpushare-tui: joined /{abi.SEGMENT_PREFIX}{key} slot {share.slot} "
                f"(weight {share.weight:g}, {counted(share.membership.peers_alive(), 'peer')} alive)"
            )
        run_synth(
            share,
            step_ms=step_ms,
            duration_s=duration_s,
            pace=pace,
            pattern=pattern,
            status_file=status_file,
            report=report,
            units=units,
            stats=stats,
            stop=share.stop_requested,
        )
    except KeyboardInterrupt:
        pass
    finally:
        with termination_deferred():
            share.close()
    return stats
