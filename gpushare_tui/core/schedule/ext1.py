"""Which schedule applies: §5, or Extension 1's (spec registry-abi.md §7). Pure: time is a parameter.

`decide(slots, now_us)` is the one deciding function the pacer and the supervisor pace by (and the
views may show): any §4 member lacking EXT1 puts everyone on §5 unchanged; otherwise the members are
the alive slots with a valid weight and DEMAND, the ones holding priority (INTERACTIVE, PRIORITY set,
published busy within their plain share) run by §5 over themselves alone, and every other member
waits. `next_priority` is an interactive owner's PRIORITY hysteresis; `BusyMeter` the busy fraction
over the last second it is judged on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..registry import abi
from ..registry.abi import SlotRecord
from . import v1 as schedule

MODE_V1 = "v1"  # §5 unchanged (a v1 member forces it: `v1_peer`)
MODE_EXT1 = "ext1"  # Extension 1, no member holds priority: §5 over every DEMAND member
MODE_PRIORITY = "priority"  # Extension 1: §5 over the priority members; the others wait

BUDGET_PPM = 1_000_000  # busy_ppm of a full budget: priority while busy_ppm <= BUDGET_PPM * S_i
RESET_FRACTION = 0.9  # ... and, once lost, again only below RESET_FRACTION * BUDGET_PPM * S_i
REREAD_US = 4_000  # a member that may run re-reads this often while an INTERACTIVE peer is alive (§7: 5 ms)
WAIT_REREAD_US = 20_000  # a member waiting for a priority member re-reads this often: only to resume (§7)


@dataclass(frozen=True)
class Decision:
    """The schedule in force and why. `members`: the slots it is computed from (§5 members in v1
    mode, DEMAND members otherwise), in slot order; `priority`: those holding priority (the
    schedule's slots then); `v1_peer`: the first §4 member lacking EXT1, which forces §5;
    `interactive_alive`: some alive slot is INTERACTIVE (Extension-1 peers then re-read fast)."""

    mode: str
    schedule: schedule.Schedule | None
    members: tuple[int, ...]
    priority: tuple[int, ...] = ()
    v1_peer: int | None = None
    interactive_alive: bool = False

    def waits(self, slot: int | None) -> bool:
        """True when `slot` is a member that may not run at all now: a priority member exists and it
        is none (it waits until the registry changes, not for a window)."""
        return self.mode == MODE_PRIORITY and slot is not None and slot in self.members and slot not in self.priority

    def paced(self, slot: int | None) -> bool:
        """`slot` is in the schedule's windows (it sleeps outside its own)."""
        return self.schedule is not None and slot is not None and slot in self.schedule.slots

    def may_run(self, slot: int | None, now_us: int) -> bool:
        """Not waiting, and unpaced or inside its window."""
        if self.waits(slot):
            return False
        return slot is None or schedule.may_run(self.schedule, slot, now_us)


def _has_demand(s: SlotRecord, now_us: int) -> bool:
    return bool(s.flags & abi.FLAG_DEMAND) and s.is_alive(now_us) and abi.weight_is_valid(s.weight)


def plain_share(slots: Iterable[SlotRecord], slot: int, weight: float, now_us: int) -> float:
    """S_i = w_i / Σ_members w for `slot` (weight `weight`) counted as a member whatever its own
    DEMAND bit says (an owner judging its budget before raising DEMAND): §7 rule 2."""
    others = sum(float(s.weight) for s in slots if s.index != slot and _has_demand(s, now_us))
    return weight / (weight + others) if weight > 0 else 0.0


def _within_budget(s: SlotRecord, share: float) -> bool:
    return s.busy_ppm <= BUDGET_PPM * share


def decide(slots: Iterable[SlotRecord], now_us: int) -> Decision:
    """The schedule every peer computes from these slots at `now_us` (spec §7, compatibility first)."""
    ordered = sorted(slots, key=lambda s: s.index)
    interactive = any(s.flags & abi.FLAG_INTERACTIVE and s.is_alive(now_us) for s in ordered)
    v1 = [s for s in ordered if s.is_member(now_us) and not s.ext1]
    if v1:
        v1_members = schedule.member_weights(ordered, now_us)
        return Decision(
            MODE_V1,
            schedule.build_schedule(v1_members),
            tuple(i for i, _ in v1_members),
            v1_peer=v1[0].index,
            interactive_alive=interactive,
        )
    members = [s for s in ordered if _has_demand(s, now_us)]
    total = sum(float(s.weight) for s in members)
    prio = [
        s
        for s in members
        if s.flags & abi.FLAG_INTERACTIVE and s.flags & abi.FLAG_PRIORITY and _within_budget(s, float(s.weight) / total)
    ]
    chosen = prio or members
    return Decision(
        MODE_PRIORITY if prio else MODE_EXT1,
        schedule.build_schedule([(s.index, float(s.weight)) for s in chosen]),
        tuple(s.index for s in members),
        priority=tuple(s.index for s in prio),
        interactive_alive=interactive,
    )


def next_priority(had: bool, busy_ppm: int, share: float) -> bool:
    """An INTERACTIVE owner's PRIORITY bit after measuring `busy_ppm` against plain share `share`:
    kept while busy_ppm <= 1e6·S, cleared once above; set again only once busy_ppm < 0.9e6·S."""
    if had:
        return busy_ppm <= BUDGET_PPM * share
    return busy_ppm < RESET_FRACTION * BUDGET_PPM * share


class BusyMeter:
    """Busy µs over the last `window_us` of (monotonic) time, idle time included: the fraction an
    interactive owner's budget is judged on. Buckets of `window_us / buckets`; a step counts in the
    bucket it ended in. Pure: the caller gives the times."""

    def __init__(self, window_us: int = 1_000_000, buckets: int = 20) -> None:
        self.window_us = window_us
        self._bucket_us = window_us // buckets
        self._n = buckets
        self._busy = [0] * buckets
        self._last: int | None = None  # index (absolute bucket number) of the newest bucket written

    def _advance(self, now_us: int) -> int:
        b = now_us // self._bucket_us
        if self._last is None or b - self._last >= self._n:
            self._busy = [0] * self._n
        else:
            for k in range(self._last + 1, b + 1):
                self._busy[k % self._n] = 0
        if self._last is None or b > self._last:
            self._last = b
        return b

    def add(self, now_us: int, busy_us: int) -> None:
        b = self._advance(now_us)
        self._busy[b % self._n] += max(0, busy_us)

    def ppm(self, now_us: int) -> int:
        """Busy fraction over the last window, parts per million (0..1 000 000)."""
        self._advance(now_us)
        return max(0, min(BUDGET_PPM, sum(self._busy) * BUDGET_PPM // self.window_us))
