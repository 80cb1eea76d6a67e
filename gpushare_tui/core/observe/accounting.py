"""Accounting: device time and energy per engine, from the slots' busy counters (spec §7 busy_total_us).

Pure: the monotonic clock is passed in and the energy readings are given (core.energy). One reader
(`serve`, the dashboard, `--once`) keeps an `Accountant` across its refreshes:

- A peer's busy time is its slot's `busy_total_us` (source "counter": µs busy since it joined, kept by
  the engine, so a reader's restart restarts nothing). A v1 peer has no counter: one without the EXT1
  flag whose counter stays 0 while it is active with `busy_ppm > 0` for V1_EVIDENCE_S of busy time is
  integrated from `busy_ppm` between refreshes instead (source "busy_ppm", since this reader first saw
  it, that wait included). Until then it counts as "counter", its busy time unknown (None) while it
  shows `busy_ppm > 0` with the counter at 0 (an engine of ours whose counter has not risen yet looks
  the same); a series that stayed at 0 is all a switch leaves behind.
- Per owner (slot, pid, boot_us): a new owner of a slot is a new account. Within one, the counter never
  goes down here even if the slot's does (a bad writer).
- The GPU's busy time is the sum of its peers' busy deltas since this reader started, and it never
  outruns time: each delta is capped at the time since that peer was last read plus
  BUSY_DELTA_SLACK_S, and their SUM by a bucket of wall time (`TimeBudget`: each refresh adds the time
  since the last one, at most BUSY_DELTA_SLACK_S carried over). Over any span T the total rises by at
  most T + BUSY_DELTA_SLACK_S, whatever the peers write (one whose busy_total_us jumps by 1e15 a second
  included; a per-peer cap alone let the slack of every refresh through: 2.4x wall time).
- Energy: each interval between two readings is split among the peers in proportion to their busy
  deltas over the same interval, the rest to idle (core.energy.split_energy). A peer that left during
  the interval is not read at its end: its part goes to idle. A reading that cannot be compared (reset)
  attributes nothing for that interval.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from ..host.budgets import ACCOUNTING_BUSY_SLACK_S
from ..host.clock import ClockUs, mono_us
from .energy import EnergyReading, energy_delta_j, split_energy
from .snapshot import GpuSnapshot, PeerSnapshot

SOURCE_COUNTER = "counter"
SOURCE_BUSY_PPM = "busy_ppm"
V1_EVIDENCE_S = 1.0  # busy_ppm integrated while active with no counter rising: a v1 owner (source busy_ppm)
BUSY_DELTA_SLACK_S = ACCOUNTING_BUSY_SLACK_S  # a counter published at heartbeats may rise by more than dt (budgets.py)

MAX_SPANS = 256  # BusyFromMarks: continued spans kept after the last mark (one per stop/continue cycle)

OwnerKey = tuple[int, int, int]  # (slot, pid, boot_us)


def owner_key(p: PeerSnapshot) -> OwnerKey:
    return (p.slot, p.pid, p.boot_us)


@dataclass(frozen=True)
class PeerAccount:
    source: str  # SOURCE_COUNTER or SOURCE_BUSY_PPM
    busy_s: float | None  # counter: busy since it joined; busy_ppm: since this reader saw it (None: not yet)
    energy_j: float | None  # attributed since this reader first saw it; None: no energy source, or no interval yet


@dataclass(frozen=True)
class GpuAccount:
    peers: tuple[tuple[OwnerKey, PeerAccount], ...] = ()
    busy_s: float = 0.0  # Σ of the peers' busy time since this reader started
    idle_energy_j: float | None = None  # None: no energy source (yet)
    energy_source: str | None = None  # "nvml" / "rapl" when known
    # (user, busy s since this reader started) per user (spec §8.1: the real uid of each peer's pid; the
    # peers whose user is not verifiable here count under UNVERIFIED_USER): device time per person
    users: tuple[tuple[str, float], ...] = ()

    def of(self, p: PeerSnapshot) -> PeerAccount | None:
        key = owner_key(p)
        return next((a for k, a in self.peers if k == key), None)


@dataclass
class _Owner:
    source: str
    counter_us: int
    last_mono_us: int
    last_busy_pct: float
    integrated_s: float | None = None
    energy_j: float | None = None
    pending_s: float = 0.0  # busy_ppm integrated while active with the counter at 0 (V1_EVIDENCE_S decides)
    unknown: bool = False  # busy_ppm > 0 and no counter yet: its busy time is not known (yet)


def _no_counter_yet(p: PeerSnapshot) -> bool:
    """Busy without a counter so far: maybe a v1 owner (it writes zeros where Extension 1 keeps busy_total_us),
    maybe one whose counter is about to rise (a supervisor's busy_ppm is its engine's CPU, even idle)."""
    return not p.ext1 and p.busy_total_us == 0 and p.busy_pct > 0


class TimeBudget:
    """A bucket of wall time (pure, monotonic µs): `take(want_s, now)` grants at most the time since
    the last take plus what earlier takes left, that carry capped at `slack_s` (it starts full: a
    counter published at heartbeats may show, at a reader's first interval, busy time from before).
    Over any span T the grants sum to at most T + slack_s: one device is busy at most all the time."""

    def __init__(self, slack_s: float) -> None:
        self.slack_s = slack_s
        self._carry_s = slack_s
        self._last_us: int | None = None

    def take(self, want_s: float, now_us: int) -> float:
        elapsed_s = 0.0 if self._last_us is None else max(0, now_us - self._last_us) / 1e6
        self._last_us = now_us if self._last_us is None else max(self._last_us, now_us)
        available_s = self._carry_s + elapsed_s
        granted_s = min(max(0.0, want_s), available_s)
        self._carry_s = min(self.slack_s, available_s - granted_s)
        return granted_s


UNVERIFIED_USER = "?"  # the user label of busy time whose peer's user this reader could not verify


class GpuAccountant:
    """The accounts of one segment's peers across refreshes (`update` once per refresh)."""

    def __init__(self) -> None:
        self._owners: dict[OwnerKey, _Owner] = {}
        self._busy_s = 0.0
        self._busy_budget = TimeBudget(BUSY_DELTA_SLACK_S)  # the sum of the deltas: at most wall time
        self._user_busy_s: dict[str, float] = {}  # kept when a peer leaves: a counter per person
        self._energy_prev: tuple[EnergyReading, int] | None = None
        self._idle_j: float | None = None
        self._energy_source: str | None = None

    def update(self, peers: Iterable[PeerSnapshot], now_mono_us: int, energy: EnergyReading | None) -> GpuAccount:
        present: set[OwnerKey] = set()
        deltas: dict[OwnerKey, float] = {}
        user_of: dict[OwnerKey, str] = {}
        for p in peers:
            if p.pid == 0:
                continue
            key = owner_key(p)
            present.add(key)
            user_of[key] = p.user if p.user is not None else UNVERIFIED_USER
            o = self._owners.get(key)
            if o is None:
                self._owners[key] = _Owner(SOURCE_COUNTER, p.busy_total_us, now_mono_us, p.busy_pct)
                self._owners[key].unknown = _no_counter_yet(p)
                continue
            if not p.alive:  # frozen until it heartbeats again (or is evicted)
                o.last_mono_us = now_mono_us
                o.last_busy_pct = 0.0
                continue
            dt_s = max(0, now_mono_us - o.last_mono_us) / 1e6
            if o.source == SOURCE_COUNTER and o.counter_us == 0:
                o.unknown = _no_counter_yet(p)
                inc_s = (o.last_busy_pct + p.busy_pct) / 200 * dt_s if o.unknown and p.active else 0.0
                o.pending_s += inc_s  # working, and still no counter: integrated while we wait
                if o.pending_s >= V1_EVIDENCE_S:  # its counter would have risen by now: a v1 owner
                    o.source, o.integrated_s, o.unknown = SOURCE_BUSY_PPM, o.pending_s - inc_s, False
            if o.source == SOURCE_COUNTER:
                delta_s = max(0, p.busy_total_us - o.counter_us) / 1e6
                o.counter_us = max(o.counter_us, p.busy_total_us)
            else:
                delta_s = (o.last_busy_pct + p.busy_pct) / 200 * dt_s  # trapezoid between the two reads
                o.integrated_s = (o.integrated_s or 0.0) + delta_s
            deltas[key] = min(delta_s, dt_s + BUSY_DELTA_SLACK_S)
            o.last_mono_us, o.last_busy_pct = now_mono_us, p.busy_pct
        for gone in set(self._owners) - present:
            del self._owners[gone]
        granted_s = self._busy_budget.take(sum(deltas.values()), now_mono_us)
        self._busy_s += granted_s
        scale = granted_s / sum(deltas.values()) if sum(deltas.values()) > 0 else 0.0  # users' busy sums to the GPU's
        for key, d in deltas.items():
            self._user_busy_s[user_of[key]] = self._user_busy_s.get(user_of[key], 0.0) + d * scale
        self._attribute(energy, now_mono_us, deltas)
        return GpuAccount(
            tuple((k, self._account(o)) for k, o in self._owners.items()),
            self._busy_s,
            self._idle_j,
            self._energy_source,
            tuple(sorted(self._user_busy_s.items())),
        )

    def _attribute(self, energy: EnergyReading | None, now_mono_us: int, deltas: dict[OwnerKey, float]) -> None:
        prev, self._energy_prev = self._energy_prev, None if energy is None else (energy, now_mono_us)
        if energy is None:
            return  # the next interval starts at the next reading (busy deltas and energy cover the same one)
        self._energy_source = energy.source
        if self._idle_j is None:
            self._idle_j = 0.0
        if prev is None:
            return
        spent = energy_delta_j(prev[0], energy)
        if spent is None:
            return
        shares, idle = split_energy(spent, dict(deltas), (now_mono_us - prev[1]) / 1e6)
        self._idle_j += idle
        for key, o in self._owners.items():
            o.energy_j = (o.energy_j or 0.0) + shares.get(key, 0.0)

    @staticmethod
    def _account(o: _Owner) -> PeerAccount:
        if o.source == SOURCE_COUNTER:
            busy = None if o.unknown and o.counter_us == 0 else o.counter_us / 1e6
        else:
            busy = o.integrated_s
        return PeerAccount(o.source, busy, o.energy_j)


class Accountant:
    """Every segment's `GpuAccountant`, keyed by segment name; `clock_us` is the monotonic clock (injected)."""

    def __init__(self, clock_us: ClockUs = mono_us) -> None:
        self._clock = clock_us
        self._gpus: dict[str, GpuAccountant] = {}

    def update(self, snap: GpuSnapshot, energy: EnergyReading | None) -> GpuAccount:
        acc = self._gpus.get(snap.segment)
        if acc is None:
            acc = self._gpus[snap.segment] = GpuAccountant()
        return acc.update(snap.peers, self._clock(), energy)

    def retain(self, segments: Iterable[str]) -> None:
        """Forget the segments (by name) not in `segments` (gone since the last refresh)."""
        keep = set(segments)
        for k in [k for k in self._gpus if k not in keep]:
            del self._gpus[k]


class BusyFromMarks:
    """A supervised engine's busy time (pure, monotonic µs): the time it was continued, between
    consecutive marks of activity at most `max_gap_us` apart (the monitor marks the latest moment the
    engine was seen decoding, every tick or probe while it works). Time stopped is never continued;
    idle time has no marks (nor the 2 s activity window after the last one): neither counts. A first
    mark after a longer gap starts a new burst and counts nothing before it."""

    def __init__(self, max_gap_us: int) -> None:
        self.max_gap_us = max_gap_us
        self._mark_us: int | None = None
        self._spans: list[list[int]] = []  # continued [start, end), after the last mark, merged

    def continued(self, start_us: int, end_us: int) -> None:
        """The engine ran (was not stopped) over [start_us, end_us)."""
        if end_us <= start_us:
            return
        if self._spans and self._spans[-1][1] >= start_us:
            self._spans[-1][1] = max(self._spans[-1][1], end_us)
        else:
            self._spans.append([start_us, end_us])

    def mark(self, last_active_us: int | None) -> int:
        """The latest activity mark now; returns the busy µs newly known (continued time up to it)."""
        if last_active_us is None or (self._mark_us is not None and last_active_us <= self._mark_us):
            self._prune()
            return 0
        prev, self._mark_us = self._mark_us, last_active_us
        counted = 0
        if prev is not None and last_active_us - prev <= self.max_gap_us:
            counted = sum(max(0, min(e, last_active_us) - max(s, prev)) for s, e in self._spans)
        self._prune()
        return counted

    def _prune(self) -> None:
        """Drop the spans before the last mark (counted, or before a new burst), and those too old to count."""
        floor = self._mark_us
        if floor is None and self._spans:
            floor = self._spans[-1][1] - self.max_gap_us
        if floor is None:
            return
        self._spans = [[max(s, floor), e] for s, e in self._spans if e > floor][-MAX_SPANS:]


class InFlightClock:
    """The time (µs, monotonic) with work in flight, from the changes of a flag (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since_us: int | None = None  # in flight since (None: not now)
        self._total_us = 0

    def set(self, in_flight: bool, now_us: int) -> None:
        with self._lock:
            if in_flight and self._since_us is None:
                self._since_us = now_us
            elif not in_flight and self._since_us is not None:
                self._total_us += max(0, now_us - self._since_us)
                self._since_us = None

    def total_us(self, now_us: int) -> int:
        with self._lock:
            return self._total_us + (max(0, now_us - self._since_us) if self._since_us is not None else 0)
