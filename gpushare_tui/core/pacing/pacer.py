"""In-process TDM pacer for Python engine loops (spec §5.7)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable

from ..host.clock import ClockUs, mono_us, wall_us
from ..observe.users import UserReader
from ..registry import abi
from ..registry.abi import SlotRecord
from ..registry.membership import Membership
from ..registry.segment import Segment, SegmentError
from ..schedule import ext1 as schedule_ext1
from ..schedule import ext2 as schedule_ext2
from ..schedule import v1 as schedule

BUSY_WINDOW_US = 1_000_000  # busy_ppm is the busy fraction over consecutive windows this long (pacer and supervisor)
BUSY_EARLY_US = 200_000  # after resuming from idle, the first this-long part of the window is published at once
TRIM_STEP_MAX_US = 40_000  # longer steps (or idle gaps counted as one) are not averaged into the step estimate
TRIM_LEAD_MAX_US = 5_000  # a sleep ends at most this much early
TRIM_EWMA = 0.1
DECIDE_TTL_US = 100_000  # unchanged slot bytes: the decision is re-made this often (aliveness ages on a 3 s scale)


class RegistryReader:
    """The slots and schedule_ext2.decide's decision (§5, §7 or §8), cheaply re-read: the slots are parsed
    again only when the table's bytes changed (one 2 KiB copy to compare, < 1 µs), and the decision is
    re-made when they changed, when asked, or DECIDE_TTL_US after the last one (a heartbeat ageing past
    3 s is then seen within 100 ms). What lets Extension 1's frequent re-reads cost < 2 % of a core.
    The slots' users (§8.1) come from a UserReader (each re-read from /proc at most once a second)."""

    def __init__(self, users: UserReader | None = None) -> None:
        self.slots: tuple[SlotRecord, ...] = ()
        self._raw = b""
        self._decision: schedule_ext2.Decision | None = None
        self._decided_mono_us = 0
        self._users = users if users is not None else UserReader()
        self.uids: dict[int, int | None] = {}  # slot -> its user as of the last decision

    def read(self, seg: Segment, now_us: int, mono_us: int, force: bool = False) -> schedule_ext2.Decision:
        raw = seg.slots_raw()
        if raw != self._raw:
            self.slots, self._raw = seg.read_slots(), raw
            self._decision = None
        d = self._decision
        if d is None or force or mono_us - self._decided_mono_us >= DECIDE_TTL_US:
            self.uids = self._users.uids(self.slots, now_us)
            d = self._decision = schedule_ext2.decide(self.slots, now_us, self.uids)
            self._decided_mono_us = mono_us
        return d

    def sync_users_bit(self, m: Membership, now_us: int) -> bool:
        """Keep our USERS bit (spec §8.2): an Extension-1 owner sets it while it knows the user of every
        other alive slot, and clears it at once when it does not. True when the bit changed."""
        if not m.flags & abi.FLAG_EXT1 or m.slot is None:
            return False
        return m.set_users(schedule_ext2.verifies_all_others(self.slots, m.slot, self.uids, now_us))

    def own_share(self, slots: Iterable[SlotRecord], slot: int, weight: float, now_us: int) -> float:
        """Our S_i for the PRIORITY budget (§7 rule 2): the user share e_i while the user shares are in
        force (§8.3 rule 3), else the plain share."""
        d = self._decision
        if d is not None and d.users_applied:
            e = schedule_ext2.user_share(slots, slot, weight, self.uids, now_us)
            if e is not None:
                return e
        return schedule_ext1.plain_share(slots, slot, weight, now_us)


class Pacer:
    """Call `step_done()` after each decode step.

    It marks the member active (at once), re-reads the registry, and when the
    step ended outside our window sleeps exactly until our next window starts.
    Alone, or with every other peer idle, there is no schedule and it never sleeps. The share
    floor holds over time whatever other members write (schedule.longest_sleep_us, owed_run_us):
    no sleep is longer than (1 - f) * period, and the run owed after one is run before the next.
    It also publishes the busy fraction (time not spent sleeping here). The schedule
    runs on `clock_us` (wall, shared); busy time and sleeps are measured on `mono_us`.

    Extension 1 (spec §7; schedule_ext1.decide is the schedule): each step raises DEMAND at once
    (the owner drops it when its work ends: GpuShare.idle, or its timeout). A member that must wait
    for a priority member sleeps in slices (schedule_ext1.wait_slice_us: 4 ms, up to 20 ms), re-reading,
    until it may run; while any
    alive peer is INTERACTIVE a running member re-reads at every step (RegistryReader: < 1 µs unchanged).
    An interactive owner keeps its PRIORITY bit by the hysteresis (schedule_ext1.next_priority) on
    its busy over the last second, idle included (BusyMeter), which is also the busy_ppm it publishes.
    A waiting member verifies that budget (schedule_ext1.HoldOffCheck): held off for longer than the
    holders' plain shares allow over the last second, it paces by §5 over every member, whatever
    they publish, until its wait is back within the allowance.
    """

    def __init__(
        self,
        membership: Membership,
        *,
        clock_us: ClockUs = wall_us,
        mono_us: ClockUs = mono_us,
        sleep_s: Callable[[float], None] = time.sleep,
        reread_us: int = 0,
        trim_edges: bool = False,
    ) -> None:
        """`reread_us`: reuse the schedule built from the registry for this long (mono µs) instead
        of re-reading all slots at every step (0: every step). Reading the slots is most of a
        step_done's cost; membership and weights change on a scale of heartbeats (500 ms).
        `trim_edges`: hold each window's edges on average (GpuShare): no step is begun with less than
        half a step of the window left (mean overshoot ~0, not half a step), and each sleep ends
        early by the mean wake-up lateness measured so far (mean start ~ the window's). Without it,
        §5.7 literally: run to the window's end, sleep exactly until the next one."""
        self._m = membership
        self._clock = clock_us
        self._mono = mono_us
        self._sleep = sleep_s
        self._window_start_us = mono_us()
        self._last_return_us = self._window_start_us
        self._busy_us = 0
        self._early = False  # the busy window is the first since resuming from idle
        self.total_slept_us = 0
        self._reread_us = reread_us
        self._sched: schedule.Schedule | None = None
        self._sched_mono_us: int | None = None
        self._reader = RegistryReader()
        self._slots: tuple[SlotRecord, ...] = ()
        self._owed_us = 0  # run time still owed since the last sleep (the floor over time)
        self._owed_until_us = 0  # mono µs the owed run ends, however late we woke (the OS's lateness is no peer's)
        self._decision: schedule_ext2.Decision | None = None
        self._meter = schedule_ext1.BusyMeter(BUSY_WINDOW_US)
        self.hold_off = schedule_ext1.HoldOffCheck()  # how long priority held us off: over budget, not believed
        self.total_waited_us = 0  # of total_slept_us: waiting for a priority member (Extension 1)
        self._trim = trim_edges
        self._step_est_us = 0.0  # mean step (EWMA) of steps no longer than TRIM_STEP_MAX_US
        self._lead_us = 0.0  # mean wake-up lateness (EWMA): how much early each sleep ends
        self.wake_late_us: deque[int] = deque(maxlen=256)  # trim_edges: recent wake-up lateness (µs)

    @property
    def decision(self) -> schedule_ext2.Decision | None:
        """The schedule (and why) as of the last re-read; None before the first step."""
        return self._decision

    def _reread(self, now: int, mono: int, force: bool = False, waited: bool = False) -> schedule_ext2.Decision:
        """The decision, re-read from the registry when due (reread_us; every step while an
        INTERACTIVE peer is alive) or `force`d. An interactive owner's PRIORITY is updated here, and a
        waiting member's check of the holders' budget (`waited`: the time since the last re-read was a
        wait for priority) made."""
        d = self._decision
        every = self._reread_us
        if d is not None and d.interactive_alive:  # every step: a re-read of unchanged bytes costs < 1 µs
            every = 0
        if d is not None and not force and self._sched_mono_us is not None and mono - self._sched_mono_us < every:
            return d
        seg = self._m.segment
        d = self._reader.read(seg, now, mono)
        self._slots = self._reader.slots
        changed = self._reader.sync_users_bit(self._m, now)  # our USERS bit (§8.2), at once
        if self._update_priority(now, mono) or changed:  # our own bit changed: decide on what we now publish
            d = self._reader.read(seg, now, mono, force=True)
            self._slots = self._reader.slots
        d = schedule_ext2.judged(d, self.hold_off.judge(d, self._m.slot, self._slots, now, mono, waited=waited))
        self._decision = d
        self._sched = d.schedule
        self._sched_mono_us = mono
        return d

    def _update_priority(self, now: int, mono: int) -> bool:
        """An interactive owner: PRIORITY by the hysteresis on its busy over the last second against
        its plain share, published with that busy. True when the bit changed."""
        m = self._m
        if not m.interactive or m.slot is None:
            return False
        ppm = self._meter.ppm(mono)
        share = self._reader.own_share(self._slots, m.slot, m.weight, now)
        had = m.priority
        want = schedule_ext1.next_priority(had, ppm, share)
        m.set_priority(want, ppm)
        return want != had

    def _may_step(self, sched: schedule.Schedule, slot: int, now: int) -> bool:
        """In our window, and (trim_edges) at least half a step of it left."""
        if not schedule.may_run(sched, slot, now):
            return False
        return not self._trim or schedule.window_end_us(sched, slot, now) - now >= self._step_est_us / 2

    def step_done(self, step_us: int | None = None) -> int:
        """Returns the µs slept (0 when we may keep running).

        `step_us` is the step's busy time; by default the time since the
        previous `step_done` returned. A segment a group member shrank under us is re-extended and our
        slot re-claimed (Membership.recover, one line); past SEGMENT_REPAIRS_PER_MIN_MAX a minute, or when
        that fails, the engine carries on unpaced (one line), never ended by it.
        """
        if self._m.say_lost_once():  # the segment is beyond repair: the engine carries on unpaced
            return 0
        try:
            return self._step_done(step_us)
        except SegmentError as e:  # shrunk under us by a group member: re-extended and re-claimed, or lost
            self._reader = RegistryReader()
            self._decision = None
            if not self._m.recover(e):
                self._m.say_lost_once()
            return 0

    def _step_done(self, step_us: int | None) -> int:
        now, mono = self._clock(), self._mono()
        step = (mono - self._last_return_us) if step_us is None else step_us
        if not self._m.active:
            # resuming after an idle spell (or the first step): the spell is not averaged into busy
            # (it would read ~0 % for a whole window while active), and the heartbeat zeroed busy_ppm
            # when we went idle, so the window's first BUSY_EARLY_US are published at once. Without
            # step_us the time since the last return is mostly the idle spell: the step is not counted.
            step = step if step_us is not None else 0
            self._window_start_us, self._busy_us, self._early = mono - step, 0, True
            self._owed_us = 0
        if self._owed_us and mono - step >= self._owed_until_us:
            self._owed_us = 0  # past the owed run's end: a late wake-up is not owed again outside our window
        self._busy_us += step
        # busy_total_us (spec §7): the step's time in our window (all of it in an owed run, or unthrottled)
        ours_us = step if self._owed_us else schedule.in_window_us(self._sched, self._m.slot, now - step, now)
        self._m.add_busy_us(ours_us)
        self._owed_us = max(0, self._owed_us - step)
        self._meter.add(mono, step)
        if self._m.flags & abi.FLAG_EXT1:
            self._m.set_demand(True)  # before the read: every peer's next read sees our work (spec §7)
        self._m.mark_active(mono)
        slot = self._m.slot
        d = self._reread(now, mono)
        slept = 0
        while d.waits(slot) and self._m.slot == slot:  # a priority member holds the device: wait, re-reading
            # the floor over time is §5's: a wait for priority owes nothing (the priority budget bounds it)
            self._owed_us = 0
            self._sleep(schedule_ext1.wait_slice_us(slept) / 1e6)
            after = self._mono()
            slept, self.total_waited_us = slept + after - mono, self.total_waited_us + after - mono
            mono, now = after, self._clock()
            d = self._reread(now, mono, force=True, waited=True)
        sched = d.schedule if d.paced(slot) else None
        if self._trim and 0 < step <= TRIM_STEP_MAX_US:
            self._step_est_us += TRIM_EWMA * (step - self._step_est_us)
        if sched is None:
            self._owed_us = 0
        elif slot is not None and self._owed_us == 0 and not self._may_step(sched, slot, now):
            target = schedule.next_window_start_us(sched, slot, now)
            if target == now:  # in our window, but less than half a step left: sleep to the next one
                target = schedule.next_window_start_us(sched, slot, schedule.window_end_us(sched, slot, now))
            want = min(target - now, schedule.longest_sleep_us(sched))
            ask = max(0, want - int(self._lead_us)) if self._trim else want
            self._sleep(ask / 1e6)
            after = self._mono()
            if self._trim:
                late = after - mono - ask
                self._lead_us += TRIM_EWMA * (min(max(late, 0), TRIM_LEAD_MAX_US) - self._lead_us)
                self.wake_late_us.append(late)
            # owed: f/(1-f) of the sleep the schedule asked (not of the OS's lateness), run from the planned
            # wake-up: under an honest schedule it lies inside our window however late we woke, and a small
            # window (Extension 2's user shares) does not spill into the next one on a loaded host
            self._owed_us = schedule.owed_run_us(sched, min(after - mono, want))
            self._owed_until_us = mono + want + self._owed_us
            slept, mono = slept + after - mono, after
        self.total_slept_us += slept
        self._last_return_us = mono
        elapsed = mono - self._window_start_us
        if self._m.interactive:
            pass  # its busy_ppm is its budget's (BusyMeter, idle included), stored with its bit in _reread
        elif elapsed >= BUSY_WINDOW_US:
            self._m.set_busy_ppm(self._busy_us * 1_000_000 // elapsed)
            self._window_start_us = mono
            self._busy_us = 0
            self._early = False
        elif self._early and elapsed >= BUSY_EARLY_US:  # once, written at once: the heartbeat zeroed it
            self._m.set_busy_ppm(self._busy_us * 1_000_000 // elapsed, publish=True)
            self._early = False
        return slept
