"""Which schedule applies: §5, or Extension 1's (spec registry-abi.md §7). Pure: time is a parameter.

`decide(slots, now_us)` is the one deciding function the pacer and the supervisor pace by (and the
views may show): any §4 member lacking EXT1 puts everyone on §5 unchanged; otherwise the members are
the alive slots with a valid weight and DEMAND, the ones holding priority (INTERACTIVE, PRIORITY set,
published busy within their plain share) run by §5 over themselves alone, and every other member
waits. `next_priority` is an interactive owner's PRIORITY hysteresis; `BusyMeter` the busy fraction
over the last second it is judged on. `HoldOffCheck` is the waiting member's side of that budget: it
measures how long priority held it off over the last second and, past what the holders' budget
allows (`held_off_allowance_us`), decides as if none of them had priority (§7, "the victim verifies").
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..host.budgets import PRIORITY_HELD_OFF_SLACK_US
from ..registry import abi
from ..registry.abi import SlotRecord
from . import v1 as schedule

MODE_V1 = "v1"  # §5 unchanged (a v1 member forces it: `v1_peer`)
MODE_EXT1 = "ext1"  # Extension 1, no member holds priority: §5 over every DEMAND member
MODE_PRIORITY = "priority"  # Extension 1: §5 over the priority members; the others wait

BUDGET_PPM = 1_000_000  # busy_ppm of a full budget: a reader believes priority while busy_ppm <= BUDGET_PPM * S_i
# The owner keeps PRIORITY only while busy_ppm <= KEEP_FRACTION * BUDGET_PPM * S_i: a holder flooding the device
# runs at 100 % until it drops the bit and then gets S_i by §5, so over the 5 s that hold its first burst it takes
# S_i + (1 - S_i) * burst / 5 s; a burst of the whole budget (S_i of a second) made that exactly S_i + 5 points at
# 1:1, and any lag in the meter went over it (measured: 57-59 % of a 1:1 flood's first 5 s)
KEEP_FRACTION = 0.8
RESET_FRACTION = 0.7  # ... and, once lost, again only below RESET_FRACTION * BUDGET_PPM * S_i
REREAD_US = 4_000  # a member that may run re-reads this often while an INTERACTIVE peer is alive (§7: 5 ms)
WAIT_REREAD_US = 20_000  # a member waiting for a priority member re-reads this often: only to resume (§7)
WAIT_FIRST_REREAD_US = 4_000  # ... after a first wait this short, doubling up to WAIT_REREAD_US (wait_slice_us)
HELD_OFF_WINDOW_US = 1_000_000  # a waiting member measures its wait for priority over the last second ...
# ... and allows the holders S_P of its own windows plus this much (core/host/budgets.py says why)
HELD_OFF_SLACK_US = PRIORITY_HELD_OFF_SLACK_US
HELD_OFF_RESET_FRACTION = 0.5  # over budget until the wait is back under this much of the allowance
HELD_OFF_BUCKETS = 50  # the waiting member's meters: 20 ms buckets
HELD_OFF_GAP_US = 500_000  # a longer time between two re-reads (an idle spell, a stall) is not metered


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
    priority_share: float = 0.0  # S_P: the priority members' plain shares summed (their budget, §7 rule 2)
    over_budget: tuple[int, ...] = ()  # priority members a waiting member judged over budget (HoldOffCheck)

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


def wait_slice_us(waited_us: int) -> int:
    """How long a member that has waited `waited_us` for priority sleeps before its next re-read:
    WAIT_FIRST_REREAD_US at first, about doubling with the wait, at most WAIT_REREAD_US. A short
    priority burst (or a bit flipped faster than we read) costs a few ms, not 20; a long wait
    re-reads every 20 ms (§7: under 2 % of a core)."""
    return max(WAIT_FIRST_REREAD_US, min(WAIT_REREAD_US, waited_us))


def _has_demand(s: SlotRecord, now_us: int) -> bool:
    return bool(s.flags & abi.FLAG_DEMAND) and s.is_alive(now_us) and abi.weight_is_valid(s.weight)


_WORD = struct.Struct("<I")
_STAMP = struct.Struct("<q")
_OFF_ACTIVE = abi.SLOT_OFFSETS["active"]


def others_may_share(raw: bytes, slot_size: int, own: int | None, now_us: int) -> bool:
    """Whether a slot of `raw` (every slot's bytes, one unchecked copy: Segment.slots_raw) other than `own`
    could be scheduled beside us: alive with DEMAND (a §7 member), or alive, active and lacking EXT1 (a §4
    member, which puts everyone on §5). False: our own DEMAND makes us the only member, and any schedule
    leaves us unpaced (§5.1). A slot caught mid-write (odd seq) counts: it cannot be told apart. A weight
    is not checked: an invalid one only makes this say True where False was right. ~40 times cheaper than
    `decide` over parsed slots: what lets a front proxy's request skip a pace round that cannot matter."""
    for off in range(0, len(raw) - abi.SLOT_SIZE + 1, slot_size):
        if off // slot_size == own or not _WORD.unpack_from(raw, off + abi.OFF_PID)[0]:
            continue
        if _WORD.unpack_from(raw, off + abi.OFF_SEQ)[0] & 1:
            return True
        if not -abi.ALIVE_US <= now_us - _STAMP.unpack_from(raw, off + abi.OFF_HEARTBEAT_US)[0] <= abi.ALIVE_US:
            continue
        flags = _WORD.unpack_from(raw, off + abi.OFF_FLAGS)[0]
        if flags & abi.FLAG_DEMAND or (not flags & abi.FLAG_EXT1 and _WORD.unpack_from(raw, off + _OFF_ACTIVE)[0]):
            return True
    return False


def plain_share(slots: Iterable[SlotRecord], slot: int, weight: float, now_us: int) -> float:
    """S_i = w_i / Σ_members w for `slot` (weight `weight`) counted as a member whatever its own
    DEMAND bit says (an owner judging its budget before raising DEMAND): §7 rule 2."""
    others = sum(float(s.weight) for s in slots if s.index != slot and _has_demand(s, now_us))
    return weight / (weight + others) if weight > 0 else 0.0


def _within_budget(s: SlotRecord, share: float) -> bool:
    return s.busy_ppm <= BUDGET_PPM * share


def decide(slots: Iterable[SlotRecord], now_us: int, *, ignore_priority: bool = False) -> Decision:
    """The schedule every peer computes from these slots at `now_us` (spec §7, compatibility first).
    `ignore_priority`: a waiting member that judged the priority members over budget (HoldOffCheck)
    decides as if none had priority: §5 over every member (their slots in `over_budget`)."""
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
    prio_share = sum(float(s.weight) for s in prio) / total if prio else 0.0
    voided = tuple(s.index for s in prio) if ignore_priority else ()
    if ignore_priority:
        prio = []
    chosen = prio or members
    return Decision(
        MODE_PRIORITY if prio else MODE_EXT1,
        schedule.build_schedule([(s.index, float(s.weight)) for s in chosen]),
        tuple(s.index for s in members),
        priority=tuple(s.index for s in prio),
        interactive_alive=interactive,
        priority_share=prio_share,
        over_budget=voided,
    )


def next_priority(had: bool, busy_ppm: int, share: float) -> bool:
    """An INTERACTIVE owner's PRIORITY bit after measuring `busy_ppm` against plain share `share`:
    kept while busy_ppm <= 0.8e6·S, cleared once above; set again only once busy_ppm < 0.7e6·S."""
    if had:
        return busy_ppm <= KEEP_FRACTION * BUDGET_PPM * share
    return busy_ppm < RESET_FRACTION * BUDGET_PPM * share


class BusyMeter:
    """Busy µs over the last `window_us` of (monotonic) time, idle time included: the fraction an
    interactive owner's budget is judged on. Buckets of `window_us / buckets`; a step counts in the
    bucket it ended in. `prorated`: the bucket the window's start falls in counts too, for the part of it
    inside (busy taken as spread evenly over it), so a steady fraction reads as itself at every phase; else
    only the `buckets` newest count, which read up to one bucket short (47.5 % for 50 % at 20 buckets).
    Pure: the caller gives the times."""

    def __init__(self, window_us: int = 1_000_000, buckets: int = 20, *, prorated: bool = False) -> None:
        self.window_us = window_us
        self._bucket_us = window_us // buckets
        self._prorated = prorated
        self._n = buckets + 1 if prorated else buckets  # the window's buckets (and the one its start falls in)
        self._busy = [0] * self._n
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
        b = self._advance(now_us)
        busy: float = sum(self._busy)
        if self._prorated:  # the oldest bucket (b - n + 1) lies partly before the window's start: that part is out
            oldest = self._busy[(b + 1) % self._n]
            busy -= oldest * (now_us - b * self._bucket_us) / self._bucket_us
        return max(0, min(BUDGET_PPM, int(busy * BUDGET_PPM // self.window_us)))


def held_off_allowance_us(priority_share: float, window_open_us: int) -> int:
    """How long priority members of plain shares summing to `priority_share` (S_P) may hold a waiting
    member off inside its own windows, over the last HELD_OFF_WINDOW_US in which those windows (of §5
    over every member) were open `window_open_us`: S_P of them (each holds priority only while its busy
    over the last second is within its S_i, so it takes at most S_P of anyone's time), plus
    HELD_OFF_SLACK_US."""
    return int(priority_share * window_open_us) + HELD_OFF_SLACK_US


class HoldOffCheck:
    """The waiting member's check of the priority budget (§7, "the victim verifies"). Pure: the caller
    gives the times (wall µs for the schedule's phase, monotonic µs for the meters).

    `judge(decision, slot, slots, now_wall, now, waited=...)` is called at every re-read; `waited`
    says the time since the previous call was spent waiting for priority. Over the last
    HELD_OFF_WINDOW_US it meters how long `slot`'s own windows (of §5 over every member, priority
    ignored) were open, and how much of that it spent waiting. Once the wait exceeds what the
    holders' budget allows (held_off_allowance_us), their PRIORITY is over budget whatever they
    publish: the decision is made again without it (§5 over every member: the floor holds again).
    It is believed again once the wait is back under HELD_OFF_RESET_FRACTION of the allowance. Only its own
    windows count: a peer flipping PRIORITY faster than we read takes our window slices while
    leaving the rest alone. Honest holders never trip it: one that overstays clears its own bit. With
    no history yet (`_seed`) the windows count as open at our share for the last second."""

    def __init__(self) -> None:
        self._held = BusyMeter(HELD_OFF_WINDOW_US, HELD_OFF_BUCKETS)
        self._open = BusyMeter(HELD_OFF_WINDOW_US, HELD_OFF_BUCKETS)
        self._last: tuple[int, int] | None = None  # (wall, mono) µs of the previous judge
        self.distrusted = False
        self.tripped = 0  # how many times the holders were judged over budget (status, tests)

    def _seed(self, fair: Decision, slot: int, now_us: int) -> None:
        """No history (a first re-read, or none for a whole window): as if our windows had been open,
        at our share of §5 over every member, for the last window, and never waited in. So a holder is
        allowed S_P of a whole second at first, as an honest one may take it at once after an idle spell."""
        window = fair.schedule.window_of(slot) if fair.schedule is not None else None
        share = 1.0 if fair.schedule is None or window is None else (window[1] - window[0]) / fair.schedule.period_us
        bucket_us = HELD_OFF_WINDOW_US // HELD_OFF_BUCKETS
        for k in range(HELD_OFF_BUCKETS - 1, 0, -1):  # the past buckets, oldest first (not the current one)
            self._open.add(now_us - k * bucket_us, int(share * bucket_us))

    def held_off_us(self, now_us: int) -> int:
        """µs of our own windows spent waiting for priority over the last window."""
        return self._held.ppm(now_us) * HELD_OFF_WINDOW_US // BUDGET_PPM

    def window_open_us(self, now_us: int) -> int:
        return self._open.ppm(now_us) * HELD_OFF_WINDOW_US // BUDGET_PPM

    def judge(
        self,
        d: Decision,
        slot: int | None,
        slots: Sequence[SlotRecord],
        now_wall_us: int,
        now_us: int,
        *,
        waited: bool = False,
    ) -> Decision:
        last, self._last = self._last, (now_wall_us, now_us)
        kept = d.mode == MODE_PRIORITY and slot is not None and slot in d.members and slot not in d.priority
        fair = decide(slots, now_wall_us, ignore_priority=True) if kept else d  # §5 over every member
        if slot is not None and (last is None or now_us - last[1] >= HELD_OFF_WINDOW_US):
            self._seed(fair, slot, now_us)
        elif last is not None and slot is not None and 0 < now_us - last[1] <= HELD_OFF_GAP_US:
            ours = schedule.in_window_us(fair.schedule, slot, last[0], now_wall_us) if slot in fair.members else 0
            self._open.add(now_us, ours)
            if waited:
                self._held.add(now_us, ours)
        if not kept:
            return d  # not kept waiting by priority: nothing to verify (the meters keep their history)
        allowed = held_off_allowance_us(d.priority_share, self.window_open_us(now_us))
        held = self.held_off_us(now_us)
        was = self.distrusted
        self.distrusted = held > (HELD_OFF_RESET_FRACTION * allowed if was else allowed)
        if self.distrusted and not was:
            self.tripped += 1
        return fair if self.distrusted else d
