"""Weighted TDM schedule (spec registry-abi.md §5). Pure: time is a parameter."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from ..registry.abi import SlotRecord

SHARE_FLOOR = 0.10
MIN_WINDOW_MS = 40.0
PERIOD_MIN_MS = 80
PERIOD_MAX_MS = 400
FLOOR_SLACK_US = 2_000  # an honest gap may run this much past (1 - floor) * period (rounding, a late wake-up)


def member_weights(slots: Iterable[SlotRecord], now_us: int) -> list[tuple[int, float]]:
    """(slot index, weight) of the schedule's members, in slot order."""
    return [(s.index, float(s.weight)) for s in sorted(slots, key=lambda s: s.index) if s.is_member(now_us)]


def share_pct(weights: Sequence[float]) -> list[float]:
    """Plain ratio 100·w_i/Σw, what every view shows."""
    total = sum(weights)
    return [100.0 * w / total for w in weights]


def floor_share(n_members: int) -> float:
    """The water-filling floor f = min(0.10, 1/n) of a schedule of n members (spec §5.3)."""
    return min(SHARE_FLOOR, 1.0 / n_members)


def window_shares(weights: Sequence[float]) -> list[float]:
    """Window fractions with the water-filling floor min(0.10, 1/n)."""
    n = len(weights)
    if n == 0:
        return []
    floor = floor_share(n)
    floored: set[int] = set()
    while True:
        rest = [i for i in range(n) if i not in floored]
        rest_total = sum(weights[i] for i in rest)
        shares = [0.0] * n
        for i in floored:
            shares[i] = floor
        for i in rest:
            shares[i] = (1.0 - floor * len(floored)) * weights[i] / rest_total
        low = [i for i in rest if shares[i] < floor]
        if not low:
            return shares
        floored.update(low)


def period_ms(shares: Sequence[float]) -> int:
    return min(max(math.floor(MIN_WINDOW_MS / min(shares) + 0.5), PERIOD_MIN_MS), PERIOD_MAX_MS)


@dataclass(frozen=True)
class Schedule:
    """Windows [start_us, end_us) within a period, one per member, in slot order."""

    slots: tuple[int, ...]
    shares: tuple[float, ...]
    period_us: int
    windows_us: tuple[tuple[int, int], ...]

    @property
    def period_ms(self) -> int:
        return self.period_us // 1000

    def window_of(self, slot: int) -> tuple[int, int] | None:
        try:
            return self.windows_us[self.slots.index(slot)]
        except ValueError:
            return None


def build_schedule(members: Sequence[tuple[int, float]]) -> Schedule | None:
    """Schedule for (slot, weight) members; None when n <= 1 (run unthrottled).

    Memoised: the pacer and supervisor rebuild it on every step, and the
    member set rarely changes."""
    return _build_schedule(tuple(members))


@lru_cache(maxsize=64)
def _build_schedule(members: tuple[tuple[int, float], ...]) -> Schedule | None:
    if len(members) <= 1:
        return None
    weights = [w for _, w in members]
    shares = window_shares(weights)
    period_us = 1000 * period_ms(shares)
    starts = []
    acc = 0.0
    for s in shares:
        starts.append(math.floor(period_us * acc + 0.5))
        acc += s
    ends = starts[1:] + [period_us]
    return Schedule(
        slots=tuple(slot for slot, _ in members),
        shares=tuple(shares),
        period_us=period_us,
        windows_us=tuple(zip(starts, ends)),
    )


def holder_at(period_us: int, windows_us: Iterable[tuple[int, tuple[int, int] | None]], t_us: int) -> int | None:
    """The slot whose window [start, end) contains instant t_us's phase, t_us mod period_us (spec §5);
    None when none does. `windows_us`: (slot, its window within the period, or None) pairs."""
    pos = t_us % period_us
    for slot, w in windows_us:  # a plain loop: the pacer asks at every decode step
        if w is not None and w[0] <= pos < w[1]:
            return slot
    return None


def may_run(schedule: Schedule | None, slot: int, now_us: int) -> bool:
    """True when there is no schedule, `slot` is not a member, or now is in its window."""
    if schedule is None or slot not in schedule.slots:
        return True
    return holder_at(schedule.period_us, zip(schedule.slots, schedule.windows_us), now_us) == slot


def next_window_start_us(schedule: Schedule | None, slot: int, now_us: int) -> int:
    """now_us if `slot` may run now, else the absolute start of its next window."""
    if may_run(schedule, slot, now_us):
        return now_us
    assert schedule is not None  # may_run is True without one
    window = schedule.window_of(slot)
    assert window is not None  # and for a slot that is not a member
    start, _ = window
    pos = now_us % schedule.period_us
    base = now_us - pos + start
    return base if pos < start else base + schedule.period_us


def window_end_us(schedule: Schedule, slot: int, now_us: int) -> int:
    """Absolute end of the window containing now_us (caller checked may_run)."""
    window = schedule.window_of(slot)
    assert window is not None  # a member (the caller's may_run check)
    _, end = window
    return now_us - now_us % schedule.period_us + end


# -- the floor over time ------------------------------------------------------
#
# Every member derives the schedule from what the others write, and a member may re-write its
# weight at any instant: one that does so every millisecond can keep another's window always just
# behind "now", so that it sleeps a whole period, wakes into a moved window and sleeps again (a
# 10 % floor measured at 1.4 %). Every member's pacing policy (core/pacing/policy.py, which the pacer and
# the supervisor both drive) therefore holds the floor over time itself: no sleep (or stopped spell)
# longer than (1 - f) * period, and after one, at least f / (1 - f) of it is run before the next.
# Under an honest schedule neither bound acts: a member's gap is (1 - s) * period <= (1 - f) * period
# and its window s * period follows it.


def longest_sleep_us(schedule: Schedule) -> int:
    """The longest a member of `schedule` sleeps (or stays stopped) at once: (1 - f) * period,
    plus FLOOR_SLACK_US."""
    f = floor_share(len(schedule.slots))
    return math.floor((1.0 - f) * schedule.period_us) + FLOOR_SLACK_US


def owed_run_us(schedule: Schedule, slept_us: int) -> int:
    """The run time (µs) a member that slept `slept_us` is owed before it may sleep again, whatever
    the schedule says meanwhile: f / (1 - f) of the sleep past FLOOR_SLACK_US."""
    f = floor_share(len(schedule.slots))
    return math.floor(max(0, slept_us - FLOOR_SLACK_US) * f / (1.0 - f))


def _window_time_before(t_us: int, start_us: int, length_us: int, period_us: int) -> int:
    """µs of the periodic window [start, start + length) (+ n × period) before t (from phase 0 at t = 0)."""
    n, pos = divmod(t_us, period_us)
    return n * length_us + min(max(pos - start_us, 0), length_us)


def in_window_us(sched: Schedule | None, slot: int | None, start_us: int, end_us: int) -> int:
    """The part of [start_us, end_us) (wall µs) inside `slot`'s windows of `sched`: a pacer's step
    counts as busy only there (its overshoot past the window is the next member's window, which
    counts it). All of it without a schedule, or when `slot` is not in it."""
    if end_us <= start_us:
        return 0
    window = sched.window_of(slot) if sched is not None and slot is not None else None
    if sched is None or window is None:
        return end_us - start_us
    s, e = window
    before = _window_time_before
    return before(end_us, s, e - s, sched.period_us) - before(start_us, s, e - s, sched.period_us)
