"""In-process TDM pacer for Python engine loops (spec §5.7), and the registry side of the pacing policy
(DecisionSource) that it shares with the supervisor's pace loop."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from ..host.clock import ClockUs, mono_us, wall_us
from ..observe.users import UserReader
from ..registry import abi
from ..registry.abi import SlotRecord
from ..registry.membership import Membership
from ..registry.segment import Segment, SegmentError
from ..schedule import ext1 as schedule_ext1
from ..schedule import ext2 as schedule_ext2
from ..schedule import v1 as schedule
from . import edges as edges_
from . import policy as policy_
from .policy import BUSY_WINDOW_US

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
    The slots' users (§8.1) come from a UserReader (each re-read from /proc at most once a second).
    At DECIDE_TTL_US the users are read again, and the decision kept where they are the same and no slot
    became alive or dead since (`holds`): decide reads the time through aliveness alone, so it would say the
    same (a pace round beside a lone engine decided afresh every 100 ms for nothing). `reuse` False: decide
    afresh at every expiry, as before (the reference the tests hold it to)."""

    def __init__(self, users: UserReader | None = None) -> None:
        self.slots: tuple[SlotRecord, ...] = ()  # the claimed ones (pid set), in slot order
        self._raw = b""
        self._decision: schedule_ext2.Decision | None = None
        self._decided_mono_us = 0
        self._users = users if users is not None else UserReader()
        self.uids: dict[int, int | None] = {}  # slot -> its user as of the last decision
        self.span_us = (0, 0)  # abi.alive_span_us of the slots as of the last decision
        self.reuse = True

    def holds(self, now_us: int) -> bool:
        """No slot became alive or dead between the last decision and `now_us` (wall)."""
        return self.span_us[0] <= now_us < self.span_us[1]

    def read(self, seg: Segment, now_us: int, mono_us: int, force: bool = False) -> schedule_ext2.Decision:
        raw = seg.slots_raw()
        if raw != self._raw:
            # the claimed slots only (pid set): a free slot is never alive, and every rule looks at alive slots
            # alone (a round beside one engine then walks one slot, not sixteen, in each of them)
            self.slots, self._raw = tuple(s for s in seg.read_slots() if s.pid), raw
            self._decision = None
        d = self._decision
        if d is None or force or mono_us - self._decided_mono_us >= DECIDE_TTL_US:
            uids = self._users.uids(self.slots, now_us)
            self._decided_mono_us = mono_us
            if d is not None and not force and self.reuse and uids == self.uids and self.holds(now_us):
                return d  # the same slots, users and aliveness: the same decision
            self.uids = uids
            d = self._decision = schedule_ext2.decide(self.slots, now_us, uids)
            self.span_us = abi.alive_span_us(self.slots, now_us)
        return d


class DecisionSource:
    """The registry side of the pacing policy, shared by its two actuators (Pacer, the supervisor's pace loop):
    reads the decision (RegistryReader), publishes what the policy says about us (USERS, an interactive
    owner's PRIORITY with the busy it was judged on) and, when either changed, decides again on what we now
    publish; then the policy's check of the holders' budget (PacingPolicy.judge). `repair`: a segment a group
    member shrank under us is re-extended and our slot re-claimed (Membership.recover), or, beyond repair,
    lost (said once; the engine carries on unpaced)."""

    def __init__(self, membership: Membership, policy: policy_.PacingPolicy, users: UserReader | None = None) -> None:
        self._m = membership
        self.policy = policy
        self._users = users
        self.reader = RegistryReader(users)
        self.reuse = True  # False (tests' reference): publish afresh at every read, and the reader decide so
        self._published: tuple[schedule_ext2.Decision, int] | None = None  # (decision, our flags) last published on

    def read(self, now_us: int, mono_us: int) -> schedule_ext2.Decision:
        m, reader = self._m, self.reader
        reader.reuse = self.reuse
        d = reader.read(m.segment, now_us, mono_us)
        flags = m.flags
        # A batch owner's bits are a function of the decision's slots and users (the same decision object: the
        # same read of them), our flags and the slots' aliveness (policy.publish): all as when last published on,
        # they are the same again
        last = self._published
        if (
            last is None
            or last[0] is not d
            or last[1] != flags
            or flags & abi.FLAG_INTERACTIVE
            or not reader.holds(now_us)
        ):
            pub = self.policy.publish(d, reader.slots, reader.uids, m.slot, m.weight, flags, now_us, mono_us)
            changed = pub.users is not None and m.set_users(pub.users)  # at once (§8.2)
            if pub.priority is not None:
                changed = changed or pub.priority != m.priority
                m.set_priority(pub.priority, pub.busy_ppm)
            if changed:  # our own bits changed: decide on what we now publish
                d = reader.read(m.segment, now_us, mono_us, force=True)
            self._published = (d, m.flags) if self.reuse and reader.holds(now_us) else None
        return self.policy.judge(d, m.slot, reader.slots, now_us, mono_us)

    def repair(self, e: SegmentError) -> None:
        self._published = None
        self.reader = RegistryReader(self._users)
        if not self._m.recover(e):
            self._m.say_lost_once()


class _OpenWindow:
    """A window we woke into at its start (`start_us`, wall): its length, how late the wake-up, the steps since."""

    def __init__(self, sched: schedule.Schedule, start_us: int, scheduled_us: int, cont_late_us: int) -> None:
        self.schedule, self.start_us, self.scheduled_us = sched, start_us, scheduled_us
        self.cont_late_us = cont_late_us
        self.ran_us = 0

    @classmethod
    def at(cls, sched: schedule.Schedule | None, slot: int | None, start_us: int, now_us: int) -> _OpenWindow | None:
        """The window that starts at `start_us` (a stop's planned end), when it is ours (not the floor's limit)."""
        window = sched.window_of(slot) if sched is not None and slot is not None else None
        if sched is None or window is None or (start_us - window[0]) % sched.period_us:
            return None
        return cls(sched, start_us, window[1] - window[0], now_us - start_us)


class Pacer:
    """Call `step_done()` after each decode step.

    It marks the member active (at once), re-reads the registry, and asks the pacing policy
    (policy.PacingPolicy, every rule there) what to do: when the step ended outside our window it sleeps
    exactly until our next window starts (§5.7); while a priority member holds the device it waits in
    slices, re-reading, until it may run (§7). Alone, or with every other peer idle, there is no schedule
    and it never sleeps. It also publishes the busy fraction (time not spent sleeping here). The schedule
    runs on `clock_us` (wall, shared); busy time and sleeps are measured on `mono_us`.

    Extension 1 (spec §7): each step raises DEMAND at once (the owner drops it when its work ends:
    GpuShare.idle, or its timeout). While any alive peer is INTERACTIVE it re-reads at every step
    (RegistryReader: < 1 µs unchanged). An interactive owner's busy over the last second, idle included
    (the policy's meter, fed with its steps), is also the busy_ppm it publishes.
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
        users: UserReader | None = None,
    ) -> None:
        """`reread_us`: reuse the decision read from the registry for this long (mono µs) instead
        of re-reading all slots at every step (0: every step). Reading the slots is most of a
        step_done's cost; membership and weights change on a scale of heartbeats (500 ms).
        `trim_edges`: hold each window's edges on average (GpuShare): no step is begun with less than
        half a step of the window left (mean overshoot ~0, not half a step), and each sleep ends
        early by the mean wake-up lateness measured so far (mean start ~ the window's). Without it,
        §5.7 literally: run to the window's end, sleep exactly until the next one. `users`: the slots' users
        (§8.1; default: read from /proc)."""
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
        self._sched_mono_us: int | None = None
        self.policy = policy_.PacingPolicy()
        self._source = DecisionSource(membership, self.policy, users)
        self._decision: schedule_ext2.Decision | None = None
        self._fast = False  # the last action asked for §7's fast re-read: re-read at every step
        self.total_waited_us = 0  # of total_slept_us: waiting for a priority member (Extension 1)
        self._trim = trim_edges
        self._step_est_us = 0.0  # mean step (EWMA) of steps no longer than TRIM_STEP_MAX_US
        self._lead_us = 0.0  # mean wake-up lateness (EWMA): how much early each sleep ends
        self.wake_late_us: deque[int] = deque(maxlen=256)  # trim_edges: recent wake-up lateness (µs)
        self.edges = edges_.ring()  # each window we woke into at its start: what our steps ran of it
        self._window: _OpenWindow | None = None

    @property
    def decision(self) -> schedule_ext2.Decision | None:
        """The schedule (and why) as of the last re-read; None before the first step."""
        return self._decision

    @property
    def hold_off(self) -> schedule_ext1.HoldOffCheck:
        return self.policy.hold_off

    def _reread(self, now: int, mono: int, force: bool = False) -> schedule_ext2.Decision:
        """The decision, re-read from the registry (DecisionSource) when due (reread_us; every step while
        the policy asks for the fast re-read) or `force`d."""
        d = self._decision
        every = 0 if self._fast else self._reread_us  # every step: a re-read of unchanged bytes costs < 1 µs
        if d is not None and not force and self._sched_mono_us is not None and mono - self._sched_mono_us < every:
            return d
        d = self._decision = self._source.read(now, mono)
        self._sched_mono_us = mono
        return d

    def _act(self, d: schedule_ext2.Decision, slot: int | None, now: int, mono: int) -> policy_.Action:
        a = self.policy.act(d, slot, now, mono, lead_us=self._step_est_us / 2 if self._trim else 0)
        self._fast = a.reread_us is not None
        return a

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
            self._source.repair(e)
            self._decision = None
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
            self.policy.idle()
        self._busy_us += step
        if self._window is not None:
            self._window.ran_us += step
        # busy_total_us (spec §7): the step's time in our window (all of it in an owed run, or unthrottled)
        self._m.add_busy_us(self.policy.ran(self._m.slot, mono - step, mono, now - step, now))
        self.policy.busy(mono, step)
        if self._m.flags & abi.FLAG_EXT1:
            self._m.set_demand(True)  # before the read: every peer's next read sees our work (spec §7)
        self._m.mark_active(mono)
        slot = self._m.slot
        if self._trim and 0 < step <= TRIM_STEP_MAX_US:  # before the action: its lead is half a step
            self._step_est_us += TRIM_EWMA * (step - self._step_est_us)
        a = self._act(self._reread(now, mono), slot, now, mono)
        opened = self._window
        if opened is not None and (a.kind != policy_.RUN or a.schedule is not opened.schedule):
            self._window = None  # ended (recorded at a stop of §5), or not our window's run any more
            if a.kind == policy_.STOP and a.schedule is opened.schedule:
                late = now - opened.start_us - opened.scheduled_us  # the last step's end after the window's
                self.edges.append(edges_.Window(mono, opened.scheduled_us, opened.cont_late_us, late, opened.ran_us))
        slept = 0
        while a.kind == policy_.WAIT and self._m.slot == slot:  # a priority member holds the device: wait
            self._sleep(max(0, (a.until_us or now) - now) / 1e6)
            after = self._mono()
            slept, self.total_waited_us = slept + after - mono, self.total_waited_us + after - mono
            mono, now = after, self._clock()
            a = self._act(self._reread(now, mono, force=True), slot, now, mono)
        if a.kind == policy_.STOP and a.until_us is not None:
            want = a.until_us - now
            ask = max(0, want - int(self._lead_us)) if self._trim else want
            self._sleep(ask / 1e6)
            after = self._mono()
            if self._trim:
                late = after - mono - ask
                self._lead_us += TRIM_EWMA * (min(max(late, 0), TRIM_LEAD_MAX_US) - self._lead_us)
                self.wake_late_us.append(late)
            slept, mono = slept + after - mono, after
            # the registry as we wake, as the pace loop reads it at each stop's end: the waiting member's check
            # meters the stop under the schedule in force during it, not under the next step's
            self._reread(self._clock(), mono, force=True)
            self.policy.resumed(mono)  # what the stop owes (the floor over time); we step now (§5.7)
            self._window = _OpenWindow.at(a.schedule, slot, a.until_us, self._clock())
        self.total_slept_us += slept
        self._last_return_us = mono
        elapsed = mono - self._window_start_us
        if self._m.interactive:
            pass  # its busy_ppm is its budget's (the policy's meter), stored with its bit at each re-read
        elif elapsed >= BUSY_WINDOW_US:
            self._m.set_busy_ppm(self._busy_us * 1_000_000 // elapsed)
            self._window_start_us = mono
            self._busy_us = 0
            self._early = False
        elif self._early and elapsed >= BUSY_EARLY_US:  # once, written at once: the heartbeat zeroed it
            self._m.set_busy_ppm(self._busy_us * 1_000_000 // elapsed, publish=True)
            self._early = False
        return slept
