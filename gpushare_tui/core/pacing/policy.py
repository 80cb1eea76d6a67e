"""The pacing policy: every pacing rule, once, in the spec's order (registry-abi.md §5, §7, §8). Pure: no I/O,
the clocks are parameters (wall µs for the schedule's phase, monotonic µs for spells and meters).

Two actuators drive it: the supervisor's pace loop (SIGSTOP/SIGCONT to an engine's process group,
core/engines/pace_loop.py) and GpuShare's Pacer (sleeps between steps, pacer.py); the registry side both
share is pacer.DecisionSource. At each decision, in this order:

1. the registry's decision (§5, §7 or §8: schedule_ext2.decide, which the caller read);
2. `publish`: what we publish about ourselves — our USERS bit (§8.2), and an interactive owner's PRIORITY by
   its hysteresis on its busy over the last second against its share (§7 rule 2; the user share e_i while
   §8's shares are in force, §8.3 rule 3), with that busy in the same write. The caller decides again when
   either changed (on what it now publishes);
3. `judge`: the waiting member's check of the holders' budget (§7: over budget whatever they publish, it
   decides as if none had priority);
4. `act`: wait for a priority member (§7 rule 3: re-read in slices); unpaced (§5.1: no schedule, or not a
   member); else §5's windows (run until the window's end less a lead, or stop until the next one starts,
   §5.6-7), within the floor over time: no stop longer than (1 - f) · period (`longest_sleep_us`), and the
   run owed after one (`owed_run_us`) is run before the next stop, ending when it was planned to end (a late
   wake-up, the OS's lateness, is owed by no peer). A wait for priority owes nothing (its budget bounds it).

Between decisions the caller says what happened: `ran` (stepped or continued time: the owed run shrinks),
`busy` (our device time: the PRIORITY budget's meter), `resumed` (a stop ended where the caller slept
through it: what it owes), `idle` (an idle spell: nothing is owed across it). Spans between decisions
(re-read cadence, §7's 5 ms while an interactive peer is alive) are the caller's, from `Action.reread_us`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..registry import abi
from ..registry.abi import SlotRecord
from ..schedule import ext1 as schedule_ext1
from ..schedule import ext2 as schedule_ext2
from ..schedule import v1 as schedule

BUSY_WINDOW_US = 1_000_000  # the PRIORITY budget is judged on the busy fraction over the last second (§7 rule 2)

WAIT = "wait"  # a priority member holds the device: do not run until a re-read says otherwise (§7 rule 3)
UNPACED = "unpaced"  # no schedule for us (§5.1, or not a member): run
RUN = "run"  # run until `until_us` (our window's end less the lead, or the owed run's end)
STOP = "stop"  # do not run until `until_us` (our next window's start, or the floor's limit)


@dataclass(frozen=True)
class Publish:
    """What we publish about ourselves now. None: not ours to change (no EXT1 or no slot; not interactive)."""

    users: bool | None = None  # the USERS bit (§8.2)
    priority: bool | None = None  # the PRIORITY bit (§7 rule 2) ...
    busy_ppm: int = 0  # ... with the busy it was judged on, in the same write


@dataclass(frozen=True)
class Action:
    """Run or not, until when (wall µs, the clock the decision was made on; None: until the next decision).
    `scheduled`: a run inside our window (not an owed run): its start is a window edge. `reread_us`: decide
    again at least this often (§7: an interactive peer is alive and we may run); None: the caller's cadence."""

    kind: str
    until_us: int | None
    scheduled: bool = False
    reread_us: int | None = None
    schedule: schedule.Schedule | None = None

    @property
    def run(self) -> bool:
        return self.kind in (RUN, UNPACED)


def run_until(sched: schedule.Schedule, slot: int, now_us: int, stop_lead_us: int | float = 0) -> tuple[bool, int]:
    """(whether `slot` may run now, the absolute µs of its next edge) by §5's windows: its run ends
    `stop_lead_us` before its window does (the supervisor's SIGSTOP lead; GpuShare's half a step), and a
    window with less than that left is skipped to the next one."""
    if schedule.may_run(sched, slot, now_us):
        end = schedule.window_end_us(sched, slot, now_us)
        if now_us < end - stop_lead_us:
            return True, int(end - stop_lead_us)
        return False, schedule.next_window_start_us(sched, slot, end)
    return False, schedule.next_window_start_us(sched, slot, now_us)


def users_bit(
    slots: Iterable[SlotRecord], slot: int | None, uids: schedule_ext2.Uids, flags: int, now_us: int
) -> bool | None:
    """Our USERS bit (§8.2): an Extension-1 owner sets it while it knows the user of every other alive slot
    with a valid weight, and clears it at once when it does not. None: no EXT1, or no slot."""
    if not flags & abi.FLAG_EXT1 or slot is None:
        return None
    return schedule_ext2.verifies_all_others(slots, slot, uids, now_us)


def own_share(
    d: schedule_ext2.Decision | None,
    slots: Sequence[SlotRecord],
    slot: int,
    weight: float,
    uids: schedule_ext2.Uids,
    now_us: int,
) -> float:
    """Our S_i for the PRIORITY budget (§7 rule 2), counting ourselves a member whatever our DEMAND says:
    the user share e_i while §8's user shares are in force (§8.3 rule 3), else the plain share."""
    if d is not None and d.users_applied:
        e = schedule_ext2.user_share(slots, slot, weight, uids, now_us)
        if e is not None:
            return e
    return schedule_ext1.plain_share(slots, slot, weight, now_us)


class PacingPolicy:
    """One member's pacing: the rules above and their small state (the owed run, the current stop, the wait
    for priority, the PRIORITY budget's meter, the waiting member's check). One per member, driven from one
    thread."""

    def __init__(self) -> None:
        self.hold_off = schedule_ext1.HoldOffCheck()  # how long priority held us off: over budget, not believed
        self.meter = schedule_ext1.BusyMeter(BUSY_WINDOW_US, prorated=True)  # our busy over the last second
        self._owed_us = 0  # run time still owed since the last stop (the floor over time)
        self._owed_until_us = 0  # mono µs the owed run ends: when it was planned to (lateness is owed by no one)
        self._stop_mono_us: int | None = None  # the current stop's start (None: not stopped by §5)
        self._wake_mono_us = 0  # ... and its planned end
        self._stop_sched: schedule.Schedule | None = None  # ... and the schedule it was planned by
        self._waiting = False  # the last action was a wait for priority
        self._wait_since_us = 0
        self._schedule: schedule.Schedule | None = None  # the last decision's schedule (what counts as ours)

    @property
    def owed_us(self) -> int:
        return self._owed_us

    @property
    def stopped(self) -> bool:
        """In a stop of §5 (not a wait for priority) as of the last action."""
        return self._stop_mono_us is not None

    # -- 2. what we publish ----------------------------------------------------------------------------

    def publish(
        self,
        d: schedule_ext2.Decision | None,
        slots: Sequence[SlotRecord],
        uids: schedule_ext2.Uids,
        slot: int | None,
        weight: float,
        flags: int,
        now_us: int,
        mono_us: int,
    ) -> Publish:
        """Our USERS bit, and (interactive) PRIORITY by the hysteresis on our busy over the last second
        (`busy`) against our share, given the bits we publish now (`flags`)."""
        users = users_bit(slots, slot, uids, flags, now_us)
        if not flags & abi.FLAG_INTERACTIVE or slot is None:
            return Publish(users)
        ppm = self.meter.ppm(mono_us)
        share = own_share(d, slots, slot, weight, uids, now_us)
        want = schedule_ext1.next_priority(bool(flags & abi.FLAG_PRIORITY), ppm, share)
        return Publish(users, want, ppm)

    # -- 3. the waiting member's check -----------------------------------------------------------------

    def judge(
        self, d: schedule_ext2.Decision, slot: int | None, slots: Sequence[SlotRecord], now_us: int, mono_us: int
    ) -> schedule_ext2.Decision:
        """`d` after our check of the holders' budget, made at each fresh read (the time since the previous
        one was a wait when our last action was)."""
        believed = self.hold_off.judge(d, slot, slots, now_us, mono_us, waited=self._waiting)
        return schedule_ext2.judged(d, believed)

    # -- 4. the action ---------------------------------------------------------------------------------

    def act(
        self,
        d: schedule_ext2.Decision,
        slot: int | None,
        now_us: int,
        mono_us: int,
        *,
        lead_us: int | float = 0,
        demand: bool = True,
    ) -> Action:
        """What to do now under the (judged) decision `d`. `lead_us`: a run ends this long before its window
        does. `demand`: we have work (§7: only then does an interactive peer call for the fast re-read)."""
        self._schedule = d.schedule
        fast = schedule_ext1.REREAD_US if d.interactive_alive else None
        if d.waits(slot):  # §7 rule 3: wait, re-reading in slices; the wait owes nothing and is no §5 stop
            if not self._waiting:
                self._wait_since_us = mono_us
            self._waiting = True
            self._owed_us, self._stop_mono_us = 0, None
            slice_us = schedule_ext1.wait_slice_us(mono_us - self._wait_since_us)
            return Action(WAIT, now_us + slice_us, reread_us=slice_us, schedule=d.schedule)
        self._waiting = False
        sched = d.schedule if d.paced(slot) else None
        if sched is None or slot is None:  # §5.1, or not a member: run; nothing owed
            self._owed_us, self._stop_mono_us = 0, None
            return Action(UNPACED, None, reread_us=fast if demand else None)
        run, edge = run_until(sched, slot, now_us, lead_us)  # §5.6: our window, less the lead
        scheduled = run
        if self._stop_mono_us is not None:  # stopped: in our window, or stopped as long as the floor allows
            if run or mono_us - self._stop_mono_us >= schedule.longest_sleep_us(sched):
                self._end_stop(sched, mono_us)
                if not run:  # the floor over time: run what is owed, whatever the schedule says now
                    run, edge = True, now_us + self._owed_us
        elif not run and self._owed_us > 0:  # the owed run first, whatever the schedule says now
            run, edge = True, now_us + self._owed_us
        if run:
            return Action(RUN, edge, scheduled, fast, sched)
        if self._stop_mono_us is None:
            self._stop_mono_us = mono_us
        self._stop_sched = sched
        # §5.7: until our next window starts, but no longer than the floor allows from the stop's start
        self._wake_mono_us = min(mono_us + edge - now_us, self._stop_mono_us + schedule.longest_sleep_us(sched))
        return Action(STOP, now_us + self._wake_mono_us - mono_us, False, fast, sched)

    def _end_stop(self, sched: schedule.Schedule | None, mono_us: int) -> None:
        """The stop ends now: owed f/(1-f) of the stop as planned (not of a late wake-up), run from its
        planned end (so under an honest schedule it lies inside our window however late we woke)."""
        start = self._stop_mono_us
        if start is None:
            return
        self._stop_mono_us = None
        if sched is None:
            self._owed_us = 0
            return
        self._owed_us = schedule.owed_run_us(sched, min(mono_us, self._wake_mono_us) - start)
        self._owed_until_us = self._wake_mono_us + self._owed_us

    # -- what happened between decisions ---------------------------------------------------------------

    def resumed(self, mono_us: int) -> None:
        """A stop ended at `mono_us` with no decision at its end (GpuShare woke from its sleep and steps)."""
        self._end_stop(self._stop_sched, mono_us)

    def ran(self, slot: int | None, start_mono_us: int, end_mono_us: int, start_wall_us: int, end_wall_us: int) -> int:
        """We ran (stepped, or were continued) from start to end: the owed run shrinks by it, and is over once a
        run starts past its planned end. Returns the part of it that was ours (busy_total_us, §7): all of it in
        an owed run or unpaced, else the part inside our windows of the last decision's schedule."""
        step = max(0, end_mono_us - start_mono_us)
        if self._owed_us and start_mono_us >= self._owed_until_us:
            self._owed_us = 0  # past the owed run's end: a late wake-up is not owed again outside our window
        ours = step if self._owed_us else schedule.in_window_us(self._schedule, slot, start_wall_us, end_wall_us)
        self._owed_us = max(0, self._owed_us - step)
        return ours

    def busy(self, mono_us: int, busy_us: int) -> None:
        """`busy_us` of our device time, ending at `mono_us` (the PRIORITY budget's meter)."""
        self.meter.add(mono_us, busy_us)

    def idle(self) -> None:
        """We were idle (no member): nothing is owed across it, and no stop spans it."""
        self._owed_us, self._stop_mono_us = 0, None
