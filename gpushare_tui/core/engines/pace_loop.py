"""The supervisor's pace loop: a thin driver of the pacing policy (core/pacing/policy.py, every rule there)
whose actions are signals to the engine's process group — SIGCONT at its window's start, SIGSTOP at its end,
stopped while a priority member holds the device. It also measures the engine's device time (its continued
time while working: busy_total_us, spec §7, and the PRIORITY budget's meter) and how late each signal went
out after its window edge, and, per window it ran the engine in, what the engine ran of it (core/pacing/edges.py:
its CPU time between our SIGCONT and the next round after our SIGSTOP)."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..host.budgets import PACE_WAKE_GAP_US
from ..host.clock import ClockUs, mono_us, wall_us
from ..observe.accounting import BusyFromMarks
from ..observe.users import UserReader
from ..pacing import edges as edges_
from ..pacing import policy as policy_
from ..pacing.pacer import DecisionSource
from ..registry.membership import Membership
from ..registry.segment import SegmentError
from ..schedule import ext1 as schedule_ext1
from ..schedule import ext2 as schedule_ext2
from ..schedule import v1 as schedule

# Decide again at least this often: the wait to the next edge is split evenly (a 40.5 ms stopped spell: two waits of
# 20.25 ms; cut at the bound instead, it left a round 0.5 ms before the edge, with nothing to decide there).
RECHECK_US = 25_000
UNTHROTTLED_POLL_S = 0.025  # each wake-up disturbs the engine's threads
# A run ends this long before its window does. A SIGSTOP takes effect only once the engine's own thread runs
# to take it; sent at the edge, that thread competes for the cores with the engine just continued, and both
# ran together for 13-18% of the time on 2 vCPUs (0% with a 500 µs lead).
STOP_LEAD_US = 500
# The hand-off needs that gap as it is: a SIGCONT sent ~400 µs early (by its own measured lateness, the peer's
# stop as late as before) made the engines overlap: their threads waited for a core 54-64% of their windows
# (23% before) and the 1:1 aggregate fell from 94% to 88% of solo (bench/edges.py, load 1.9-2.9). Signals sent
# before the round's registry read with a lead adapted to the engine's busiest threads taking their stop (it
# settled at 0.6-0.85 ms) lost 1-2 points of aggregate and doubled the 2:1 ratio error (bench/edges.py's notes).
BUSY_MARK_GAP_US = 1_200_000  # activity marks this close count the continued time between (probes: 1 Hz)
# A window's run is read at the first round at least this long after our SIGSTOP: each engine thread stops as it
# next runs (within ~100 µs on an idle core; the peer continued 500 µs after us competes for the cores), and a
# thread read while still running would count part of the stop lead as run. No round is woken for it: every
# wake-up of this real-time thread preempts a running engine's thread (a ggml pool then waits for it at its next
# barrier) and costs ~300 µs of CPU with the caches cold (measured on 2 vCPUs beside two 2-thread engines:
# 66 wake-ups a second, 19-22 ms of CPU a second), so the read waits for a round the schedule needs anyway.
EDGE_SETTLE_US = 2_000
# The runqueue wait is read from a file per engine thread (~50 µs warm for llama-server's 11 threads, several
# times that cold): for one window in this many; the CPU time, one system call, for every window.
WAITED_EVERY = 8

# (CPU ns, runqueue wait ns or None when not asked: its argument) of the engine; None when unreadable
ThreadsReader = Callable[[bool], "tuple[int, int | None] | None"]


@dataclass(frozen=True)
class _OpenWindow:
    """A window we continued the engine in at its start edge: its length, how late the SIGCONT, and the
    engine's threads' counters as it was continued."""

    scheduled_us: int
    cont_late_us: int
    base: tuple[int, int | None] | None


class PaceLoop:
    """`run` until `quit` is set or `alive()` is False. `stop`/`cont`/`stopped`: the engine's process group
    (SIGSTOP, SIGCONT, whether it is stopped). `window_end_us`: the end of the run in progress (wall µs; None
    when not running by the schedule); `decision` and `action`: the schedule in force (and why) and what the
    policy said, as of the last round. `demand_exact`: DEMAND is the engine's work in flight exactly (a front
    proxy's requests), so its continued time with DEMAND is its device time as of each round; else (DEMAND
    sampled, kept 2 s past the last activity) that time counts only up to the engine's latest activity mark.
    `wake()` ends the wait between two rounds at once (the front proxy raised DEMAND: §7 has an owner re-read
    before its first step). `edges`: where each window the engine ran in is recorded (edges_.Window), its run
    read by `read_threads` (the engine's CPU time, and its threads' runqueue wait when asked; None when
    unreadable) over `cores` (the cores it may use). The clocks, the sleep, the slots' users (§8.1) and the stop
    lead may be given (tests; a given sleep is not cut short by `wake`)."""

    def __init__(
        self,
        membership: Membership,
        *,
        alive: Callable[[], bool],
        quit_event: threading.Event,
        stop: Callable[[], None],
        cont: Callable[[], None],
        stopped: Callable[[], bool],
        lateness_us: deque[int],
        clock_us: ClockUs = wall_us,
        mono_us: ClockUs = mono_us,
        sleep_s: Callable[[float], object] | None = None,
        users: UserReader | None = None,
        stop_lead_us: int = STOP_LEAD_US,
        edges: deque[edges_.Window] | None = None,
        read_threads: ThreadsReader | None = None,
        cores: int = 1,
        demand_exact: bool = False,
    ) -> None:
        self._m, self._alive, self._quit = membership, alive, quit_event
        self._stop, self._cont, self._stopped = stop, cont, stopped
        # held, except while a wake is pending: `wake` releases it, the wait between rounds acquires it (one C call
        # each: an Event's wait and set run ~40 lines of Python, ~90 µs a round with the caches cold beside an engine)
        self._woken = threading.Lock()
        self._woken.acquire()
        self._rises = self._rises_seen = 0  # DEMAND rises said by `demand_rose` (its thread), and as of the last round
        self._clock, self._mono = clock_us, mono_us
        self._sleep: Callable[[float], object] = sleep_s if sleep_s is not None else self._wait
        self.lateness_us = lateness_us
        self._lead_us = stop_lead_us
        self.policy = policy_.PacingPolicy()
        self._source = DecisionSource(membership, self.policy, users)
        self.window_end_us: int | None = None
        self.decision: schedule_ext2.Decision | None = None
        self.action: policy_.Action | None = None
        self._prev: schedule.Schedule | None = None
        self._had_demand = False  # DEMAND as of the previous round (a span counts as busy if it had work at either end)
        self._busy = BusyFromMarks(BUSY_MARK_GAP_US) if not demand_exact else None
        self._last_mono, self._last_wall = self._mono(), self._clock()
        self.edges = edges
        self._read_threads = read_threads if edges is not None else None
        self._cores = max(1, cores)
        self._open: _OpenWindow | None = None  # the window the engine was continued in at its start edge
        self._closing: tuple[_OpenWindow, int, int] | None = None  # ... stopped at its end: (it, stop lateness, mono)
        self._at_stop: tuple[int, int | None] | None = None  # the counters read since the last stop, if no CONT since
        self._opened = 0  # windows opened: every WAITED_EVERY-th has its runqueue wait read

    def run(self) -> None:
        """Pace until told to stop, at real-time priority; the calling thread's own policy is back on return."""
        before = _raise_priority()
        try:
            while not self._quit.is_set() and self._alive():
                self._woken.acquire(False)  # a wake-up during the round that follows is not lost: it ends the next wait
                start = self._mono()
                wait_us = self.step()
                # the wait counts from the step's start (its clock): the step's own time (~150-200 µs of Python on 2
                # loaded cores) is not slept again, or every edge it aims at is missed by that much
                if self._sleep(max(wait_us - (self._mono() - start), 0) / 1e6) is True:  # woken (HTTP clients)
                    gap_us = PACE_WAKE_GAP_US - (self._mono() - start)
                    if gap_us > 0:
                        time.sleep(gap_us / 1e6)
        finally:
            _restore_priority(before)

    def wake(self) -> None:
        """Decide again now, or PACE_WAKE_GAP_US after the last round's start (thread-safe): work arrived for an
        engine left running idle and unpaced, which would otherwise run outside its window until the next round
        (up to 25 ms a request: a flood of short requests took ~5 points over its share so)."""
        try:
            self._woken.release()
        except RuntimeError:  # released already: a wake is pending
            pass

    def _wait(self, timeout_s: float) -> bool:
        """Until `wake` or `timeout_s`; True when woken."""
        return self._woken.acquire(True, timeout_s)

    def demand_rose(self) -> None:
        """The engine's DEMAND rose (the front proxy's first request in flight; thread-safe, called once it is
        published): `wake` where deciding at once can change what the engine may do: it is stopped, or another
        alive slot has DEMAND or is a v1 member (ext1.others_may_share), so our DEMAND makes a schedule. Else
        the engine is the only member and runs unpaced whatever a round decides: no round is spent on it (a
        pace round costs ~150-300 µs of CPU with the caches cold, and a request alone woke two), and the rise
        counts the span it falls in as busy at the next round. A peer raising DEMAND just as we read it is
        seen by our next round (unpaced, UNTHROTTLED_POLL_S apart), as one raising it just after a woken round
        always was; and a peer that decides the same way (after publishing its own DEMAND, as we do) sees ours."""
        self._rises += 1
        if self._stopped():
            self.wake()
            return
        raw = self._m.slots_raw()
        if raw is None or schedule_ext1.others_may_share(raw[0], raw[1], self._m.slot, self._clock()):
            self.wake()

    def step(self) -> int:
        """One round: account, read, decide, signal. Returns how long to wait before the next (µs), from the
        round's start."""
        m = self._m
        if m.lost is not None and m.say_lost_once():  # beyond repair (Membership.recover): the engine runs unpaced
            self.window_end_us = None
            self._open = None
            self._continue()
            return int(UNTHROTTLED_POLL_S * 1e6)
        rises = self._rises  # before DEMAND is read: a rise after this is counted by the next round
        now, mono = self._clock(), self._mono()
        if self._closing is not None and mono - self._closing[2] >= EDGE_SETTLE_US:
            self._close_window(mono)
        working_us = 0  # device time: continued with work in flight (idle between two requests counted as busy,
        if not self._stopped():  # an honest engine lost PRIORITY)
            self.policy.ran(m.slot, self._last_mono, mono, self._last_wall, now)
            # a span with work at either end, or one that rose (and maybe ended) within it
            if m.demand or self._had_demand or rises != self._rises_seen:
                working_us = mono - self._last_mono
        self._had_demand = m.demand
        self._rises_seen = rises
        if self._busy is None:  # current at every round: a meter a mark (~50-100 ms) late let a flood overstay
            device_us = working_us
        else:
            self._busy.continued(mono - working_us, mono)
            device_us = self._busy.mark(m.last_active_us)
        m.add_busy_us(device_us)  # busy_total_us (spec §7)
        self.policy.busy(mono, device_us)  # the PRIORITY budget's meter
        self._last_mono, self._last_wall = mono, now
        slot = m.slot
        try:
            d = self.decision = self._source.read(now, mono)
        except SegmentError as e:  # shrunk under us by a group member: re-extended and re-claimed, or lost
            self._source.repair(e)
            return 0
        a = self.action = self.policy.act(d, slot, now, mono, lead_us=self._lead_us, demand=m.demand)
        at_edge = d.schedule is self._prev  # not a membership change, which acts at once, off any edge
        self._prev = d.schedule
        if not at_edge:  # a window under another schedule is no window of the new one
            self._open = None
        self.window_end_us = a.until_us if a.kind == policy_.RUN else None
        if a.kind == policy_.UNPACED:
            self._continue()
            self._open = None
            poll_us = int(UNTHROTTLED_POLL_S * 1e6)
            return min(poll_us, a.reread_us or poll_us)
        if a.run:
            if self._stopped():
                edge = at_edge and a.scheduled
                # stopped since the last reading: the counters have not moved (else read before the signal)
                base = self._at_stop
                with_wait = self._opened % WAITED_EVERY == 0
                if edge and (base is None or (with_wait and base[1] is None)):
                    base = self._threads(with_wait)
                self._continue()
                self._open = None
                if edge:
                    late = self._note_lateness(a.schedule, slot, edge=0)
                    self._open = _OpenWindow(self._window_us(a.schedule, slot), late, base)
                    self._opened += 1
        elif not self._stopped():
            self._stop()
            opened, self._open = self._open, None
            if at_edge and a.kind == policy_.STOP:
                late = self._note_lateness(a.schedule, slot, edge=1)
                if opened is not None and self.edges is not None:  # read once its threads have all stopped
                    self._closing = (opened, late, self._mono())
        assert a.until_us is not None  # wait, run and stop have an end
        if a.reread_us is not None and a.reread_us < RECHECK_US:  # the policy's own re-read (spec §7: 5 ms)
            return min(a.until_us - now, a.reread_us)
        return even_wait_us(a.until_us - now, RECHECK_US)

    def _continue(self) -> None:
        """SIGCONT, unless not stopped (every unpaced round: nothing to send); a window stopped but not yet read
        is not read (the engine runs again)."""
        if self._stopped():
            self._cont()
        self._closing = self._at_stop = None

    def _threads(self, with_wait: bool) -> tuple[int, int | None] | None:
        return self._read_threads(with_wait) if self._read_threads is not None else None

    def _close_window(self, mono: int) -> None:
        """Record the window stopped at least EDGE_SETTLE_US ago: what the engine ran from our SIGCONT to now (its
        runqueue wait too where it was read as the window opened)."""
        assert self._closing is not None and self.edges is not None
        opened, stop_late, _ = self._closing
        self._closing = None
        base = opened.base
        now = self._at_stop = self._threads(base is not None and base[1] is not None)
        ran = waited = None
        if now is not None and base is not None:
            # a thread that exited meanwhile may take its time with it: never below 0
            ran = max(0, now[0] - base[0]) // 1000 // self._cores
            if now[1] is not None and base[1] is not None:
                waited = max(0, now[1] - base[1]) // 1000 // self._cores
        self.edges.append(edges_.Window(mono, opened.scheduled_us, opened.cont_late_us, stop_late, ran, waited))

    @staticmethod
    def _window_us(sched: schedule.Schedule | None, slot: int | None) -> int:
        window = sched.window_of(slot) if sched is not None and slot is not None else None
        assert window is not None  # at a window edge: a member
        return window[1] - window[0]

    def _note_lateness(self, sched: schedule.Schedule | None, slot: int | None, edge: int) -> int:
        """How late after its edge (0: window start, 1: window end less the stop lead) a signal went out (µs,
        negative: early; also kept in `lateness_us`)."""
        window = sched.window_of(slot) if sched is not None and slot is not None else None
        assert sched is not None and window is not None  # at a window edge: a member
        boundary = window[edge] - (self._lead_us if edge else 0)
        half = sched.period_us // 2
        late = (self._clock() - boundary + half) % sched.period_us - half
        self.lateness_us.append(late)
        return late


def even_wait_us(gap_us: int, bound_us: int) -> int:
    """The first of the fewest equal waits, none over `bound_us`, that reach `gap_us` from now."""
    if gap_us <= bound_us:
        return gap_us
    waits = -(-gap_us // bound_us)
    return -(-gap_us // waits)


def lateness_summary(lateness_us: deque[int]) -> dict:
    """p50/p99/max µs by which SIGCONT/SIGSTOP trailed their window edges."""
    xs = sorted(lateness_us)
    if not xs:
        return {"n": 0, "p50_us": None, "p99_us": None, "max_us": None}
    return {
        "n": len(xs),
        "p50_us": xs[len(xs) // 2],
        "p99_us": xs[min(len(xs) - 1, len(xs) * 99 // 100)],
        "max_us": xs[-1],
    }


def _raise_priority() -> tuple[int, os.sched_param] | None:
    """Real-time priority for the calling (pacing) thread where permitted (root or RLIMIT_RTPRIO): window edges
    then stay sharp even when every core is busy. Returns the thread's policy before (None: unchanged).
    SCHED_RESET_ON_FORK: a process forked from this thread starts at the normal policy. Without it a child (an
    engine, a CPU hog) would inherit SCHED_FIFO, and a busy one would take a core from every normal task and
    from each FIFO thread of its priority (FIFO threads of one priority never share a core by time)."""
    try:
        before = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(1))
    except (OSError, AttributeError):
        return None
    return before


def _restore_priority(before: tuple[int, os.sched_param] | None) -> None:
    if before is not None:
        try:
            os.sched_setscheduler(0, before[0], before[1])
        except OSError:
            pass
