"""The pacing policy's two actuators decide alike: GpuShare's Pacer (step_done, sleeping) and the supervisor's
pace loop (PaceLoop.step, signalling), each on its own real segment, driven through the same registry
histories — peers joining and leaving, weights, EXT1/INTERACTIVE/DEMAND/PRIORITY/USERS flags,
published busy (the priority budget), users (Extension 2), v1 peers, the clock advancing by steps — make the
same decisions at the same instants, publish the same bits, and owe the same run.

The two differ only where their actuators do, by design: the supervisor decides again when a stop ends (it
is woken by its loop), where the Pacer re-reads and steps (spec §5.7: it checks after each step): both read
the same registry then, and when that decision is no run (a holder believed again, say) the two part ways
for the rest of that history (the Pacer's one step of overshoot). Our own member is batch here: an
interactive owner's PRIORITY is judged at every decision, the Pacer's steps and the pace loop's rounds
falling at different instants (the rule is one, its cadence the actuator's: test_policy.py tests the rule,
and the last test here the pace loop's side of it)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpushare_tui.core.engines.pace_loop import PaceLoop
from gpushare_tui.core.host import budgets
from gpushare_tui.core.pacing import policy
from gpushare_tui.core.pacing.pacer import Pacer
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.abi import SlotRecord
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.registry.segment import Segment
from testkit.pace_loop import flagged_loop
from testkit.shm import remove, shm_file, unique_key

PEER_PID0 = 3_999_700  # peers' pids (no such process: their users come from the history)
PEER_SLOTS = (1, 2, 3, 4)
T0_US = 1_800_000_000_000_000
FLAG_BITS = (abi.FLAG_EXT1, abi.FLAG_INTERACTIVE, abi.FLAG_DEMAND, abi.FLAG_PRIORITY, abi.FLAG_USERS)
EXT1_DEMAND = abi.FLAG_EXT1 | abi.FLAG_DEMAND
PRIO = EXT1_DEMAND | abi.FLAG_INTERACTIVE | abi.FLAG_PRIORITY
HEARTBEAT_US = 500_000  # Membership's heartbeat thread's period


class Clock:
    """A clock that moves when told. It also stands in for our member's heartbeat thread (every
    HEARTBEAT_US, at the same instants in both worlds): without it our own slot would age out during a
    long wait, at an instant that depends on which actuator last wrote it."""

    def __init__(self, t: int) -> None:
        self.t = t
        self.next_beat_us = t + HEARTBEAT_US
        self.beating: Membership | None = None

    def __call__(self) -> int:
        return self.t

    def advance_to(self, t: int) -> None:
        while self.beating is not None and self.next_beat_us <= t:
            self.t = self.next_beat_us
            self.beating.heartbeat()
            self.next_beat_us += HEARTBEAT_US
        self.t = t

    def sleep(self, s: float) -> None:
        self.advance_to(self.t + round(s * 1e6))


class Users:
    """The slots' users (spec §8.1) as the history says (both worlds read the same)."""

    def __init__(self) -> None:
        self.of: dict[int, int | None] = {}

    def uids(self, slots: Iterable[SlotRecord], now_us: int) -> dict[int, int | None]:
        return {s.index: self.of.get(s.index) for s in slots if s.is_alive(now_us)}


@dataclass(frozen=True)
class Peer:
    weight: float
    flags: int
    busy_ppm: int
    uid: int | None


peers = st.builds(
    Peer,
    st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    st.sampled_from([EXT1_DEMAND, EXT1_DEMAND | abi.FLAG_USERS, PRIO, PRIO | abi.FLAG_USERS])
    | st.lists(st.sampled_from(FLAG_BITS), max_size=5).map(lambda bits: sum(set(bits))),
    st.sampled_from([0, 100_000, 300_000, 500_000, 700_000, 1_000_000]),
    st.sampled_from([1000, 1001, 1002, None]),
)
# one event: for some peer slots, a new state (None: it leaves); then we step for dt µs
events = st.tuples(
    st.dictionaries(st.sampled_from(PEER_SLOTS), st.none() | peers, max_size=4),
    st.integers(1_000, 120_000),
)
histories = st.tuples(
    st.sampled_from([1.0, 2.0]),  # our weight
    st.sampled_from([1000, 1001, None]),  # our user
    st.integers(T0_US, T0_US + 10_000_000),  # the clock at first (the schedules' phase)
    st.lists(events, min_size=1, max_size=25),
)


class World:
    """One actuator on its own segment, with the peers the history writes."""

    def __init__(self, key: str, clock: Clock, weight: float, users: Users) -> None:
        self.key, self.clock = key, clock
        self.me = Membership(key, weight, "me", clock_us=clock, mono_us=clock, heartbeat_s=3600, ext1=True)
        assert self.me.join() == 0
        clock.beating = self.me
        self.seg = Segment.create_or_attach(key)
        self.users = users
        self.present: dict[int, Peer] = {}

    def write_peer(self, slot: int, peer: Peer | None) -> None:
        pid = PEER_PID0 + slot
        if peer is None:
            if slot in self.present:
                self.seg.write_slot_fields(
                    slot, boot_us=1, weight=1.0, active=0, heartbeat_us=0, busy_ppm=0, name_raw=b""
                )
                assert self.seg.cas_pid(slot, pid, 0)
                del self.present[slot]
            return
        if slot not in self.present:
            assert self.seg.cas_pid(slot, 0, pid)
        self.present[slot] = peer
        self.seg.write_slot_fields(
            slot,
            boot_us=1,
            weight=peer.weight,
            active=1,
            heartbeat_us=self.clock.t,
            busy_ppm=peer.busy_ppm,
            name_raw=abi.encode_name(f"peer{slot}"),
            flags=peer.flags,
        )

    def our_bits(self) -> int:
        return self.seg.read_slot(0).flags & (abi.FLAG_USERS | abi.FLAG_PRIORITY | abi.FLAG_DEMAND)

    def close(self) -> None:
        self.me.leave()
        self.seg.close()
        remove(shm_file(self.key))


def _recorded(p: policy.PacingPolicy, into: list[tuple[str, int | None]]) -> None:
    act = p.act

    def recording(*args, **kwargs) -> policy.Action:
        a = act(*args, **kwargs)
        into.append((a.kind, a.until_us))
        return a

    p.act = recording  # type: ignore[method-assign]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories)
def test_the_pacer_and_the_pace_loop_decide_alike(history: tuple[float, int | None, int, list]) -> None:
    weight, our_uid, t0, steps = history
    users = Users()
    users.of[0] = our_uid
    clock_p, clock_s = Clock(t0), Clock(t0)
    pw = World(unique_key(), clock_p, weight, users)
    sw = World(unique_key(), clock_s, weight, users)
    try:
        pacer = Pacer(pw.me, clock_us=clock_p, mono_us=clock_p, sleep_s=clock_p.sleep, users=users)  # type: ignore[arg-type]
        loop, stopped = flagged_loop(
            sw.me, clock_s, clock_s.sleep, users=users, stop_lead_us=0
        )  # the Pacer's lead (GpuShare trims none)
        sw.me.set_demand(True)  # the proxy's: work in flight all along (the Pacer raises it at each step)
        by_pacer: list[tuple[str, int | None]] = []
        by_loop: list[tuple[str, int | None]] = []
        _recorded(pacer.policy, by_pacer)
        for n, (changes, dt) in enumerate(steps):
            assert clock_p.t == clock_s.t
            for slot in PEER_SLOTS:  # the changes, and a heartbeat of every peer present (none ages out)
                peer = changes[slot] if slot in changes else pw.present.get(slot)
                users.of[slot] = peer.uid if peer is not None else None
                pw.write_peer(slot, peer)
                sw.write_peer(slot, peer)
            clock_p.advance_to(clock_p.t + dt)
            clock_s.advance_to(clock_s.t + dt)
            by_pacer.clear()
            by_loop.clear()
            pacer.step_done(dt)
            sw.me.mark_active(clock_s.t)  # the monitor sees it working
            loop.step()
            a = loop.action
            assert a is not None
            by_loop.append((a.kind, a.until_us))
            while a.kind in (policy.WAIT, policy.STOP):  # the Pacer slept until then (and re-read when waiting)
                assert a.until_us is not None
                clock_s.advance_to(a.until_us)
                loop.step()
                a = loop.action
                assert a is not None
                if by_loop[-1][0] == policy.STOP:  # woken at the stop's end: the Pacer re-read here, and steps
                    assert loop.decision == pacer.decision, f"step {n}: the registry as both woke"
                    break
                by_loop.append((a.kind, a.until_us))
            if not a.run:  # the decision changed as both woke: the pace loop acts on it, the Pacer steps first
                event("parted at a wake-up (the Pacer's one step, §5.7)")
                return
            for kind, _ in by_pacer:
                event(f"decision: {kind}")
            d = pacer.decision
            event(f"mode: {d.mode if d else None}{' users' if d and d.users_applied else ''}")
            event(f"judged over budget: {bool(d and d.over_budget)}")
            assert by_loop == by_pacer, f"step {n}"
            assert clock_s.t == clock_p.t, f"step {n}"
            assert pw.our_bits() == sw.our_bits(), f"step {n}"
            assert pacer.policy.owed_us == loop.policy.owed_us, f"step {n}"
            assert pacer.hold_off.distrusted == loop.policy.hold_off.distrusted, f"step {n}"
            assert pacer.decision == loop.decision, f"step {n}"
    finally:
        pw.close()
        sw.close()


def test_the_pace_loop_keeps_an_interactive_engines_priority_by_its_device_time() -> None:
    """The supervisor's side of PRIORITY (§7 rule 2), now the pace loop's: the engine's continued time while
    working is its device time; the bit is set while that stays within its share over the last second, and
    cleared within a round once it does not (S = 1/2 here: alone with priority it runs all the time)."""
    clock = Clock(T0_US)
    users = Users()
    w = World(unique_key(), clock, 1.0, users)
    try:
        w.write_peer(1, Peer(1.0, abi.FLAG_EXT1 | abi.FLAG_DEMAND, 0, None))
        w.me.set_interactive(True)
        w.me.set_demand(True)
        loop, stopped = flagged_loop(w.me, clock, clock.sleep, users=users)
        bits = []
        for _ in range(100):  # 10 ms rounds, 1 s
            w.write_peer(1, w.present[1])
            w.me.mark_active(clock.t)  # working all along
            loop.step()
            ppm = loop.policy.meter.ppm(clock.t)
            bits.append(bool(w.seg.read_slot(0).flags & abi.FLAG_PRIORITY))
            if bits[-1]:
                assert ppm <= 500_000, (len(bits), ppm)  # never held past its budget
            clock.t += 10_000
        assert bits[0] and not all(bits), bits  # set at once, and cleared once it ran past its share
        assert w.seg.read_slot(0).busy_ppm > 0  # the busy it is judged on is published with the bit
    finally:
        w.close()


def test_an_engine_continued_idle_between_two_requests_is_not_busy() -> None:
    """Device time is continued time with work in flight (DEMAND): two 200 ms requests 0.8 s apart, the engine
    continued throughout (alone in the schedule while idle), read ~40 % busy over the second, and the bit stays
    set. Counted between activity marks alone (< 1.2 s apart), the idle spell read as busy: ~100 % over that
    second, and an honest engine lost PRIORITY at its next request (its gaps then §5's: tests/test_latency_class)."""
    clock = Clock(T0_US)
    users = Users()
    w = World(unique_key(), clock, 1.0, users)
    try:
        w.write_peer(1, Peer(1.0, abi.FLAG_EXT1 | abi.FLAG_DEMAND, 0, None))
        w.me.set_interactive(True)
        loop, stopped = flagged_loop(w.me, clock, clock.sleep, users=users)
        bits, ppms = [], []
        for k in range(140):  # 10 ms rounds: a request [0, 200) ms, idle, a request [1000, 1200) ms, idle
            t_ms = 10 * k
            working = t_ms < 200 or 1000 <= t_ms < 1200
            w.write_peer(1, w.present[1])
            if working != w.me.demand:
                w.me.set_demand(working)  # the proxy's: at each request's start and end
            if working:
                w.me.mark_active(clock.t)
            loop.step()
            assert not stopped[0] or not working, t_ms  # with priority (or alone) it is never stopped
            ppms.append(loop.policy.meter.ppm(clock.t))
            bits.append(bool(w.seg.read_slot(0).flags & abi.FLAG_PRIORITY))
            clock.t += 10_000
        assert all(bits[1:]), bits.index(False, 1)
        assert max(ppms) <= 450_000, max(ppms)  # 2 x 200 ms of work, a round's edge each, over any second
    finally:
        w.close()


def test_an_exact_demand_keeps_the_priority_meter_current() -> None:
    """A proxied engine's DEMAND is its work in flight exactly, so the pace loop counts its continued time with
    DEMAND at every round, not at its next activity mark: a flood alone with priority (S = 1/2) drops the bit
    within a round of running 0.8 S of the last second (400 ms), though its marks come every 100 ms and 100 ms
    old. Counted at the marks, it ran ~100-200 ms past that, and a 1:1 flood took 57-59 % of its first 5 s."""
    clock = Clock(T0_US)
    users = Users()
    w = World(unique_key(), clock, 1.0, users)
    try:
        w.write_peer(1, Peer(1.0, abi.FLAG_EXT1 | abi.FLAG_DEMAND, 0, None))
        w.me.set_interactive(True)
        w.me.set_demand(True)
        loop, stopped = flagged_loop(w.me, clock, clock.sleep, users=users, demand_exact=True)
        dropped_ms = None
        for k in range(60):  # 10 ms rounds
            w.write_peer(1, w.present[1])
            if k % 10 == 0 and k:
                w.me.mark_active(clock.t - 100_000)  # a sampled mark: late and sparse
            loop.step()
            if dropped_ms is None and not w.seg.read_slot(0).flags & abi.FLAG_PRIORITY:
                dropped_ms = 10 * k
            clock.t += 10_000
        assert dropped_ms is not None and 400 <= dropped_ms <= 420, dropped_ms
        assert w.seg.read_slot(0).busy_ppm > 400_000  # published with the bit: what it was judged on
    finally:
        w.close()


@contextmanager
def _round_counting_loop(
    w: World, rounds: list[float], stopped: Callable[[], bool] = lambda: False, **kw: Any
) -> Iterator[PaceLoop]:
    """A PaceLoop on `w`'s member in a thread of its own, each round noted in `rounds` (its monotonic time) and
    asking for a 10 s wait; ended (and its world closed) on the way out."""
    quit_event = threading.Event()
    loop = PaceLoop(
        w.me,
        alive=lambda: True,
        quit_event=quit_event,
        stop=lambda: None,
        cont=lambda: None,
        stopped=stopped,
        lateness_us=deque(),
        **kw,
    )
    loop.step = lambda: rounds.append(time.monotonic()) or 10_000_000  # type: ignore[method-assign]
    t = threading.Thread(target=loop.run, daemon=True)
    t.start()
    try:
        yield loop
    finally:
        quit_event.set()
        loop.wake()
        t.join(5)
        w.close()
    assert not t.is_alive()


def test_a_wake_ends_the_pace_loops_wait_at_once() -> None:
    """The front proxy's new request wakes the pace loop (`wake`): it decides again at once rather than at its
    next round (up to 25 ms later for an idle, unpaced engine, which meanwhile ran outside its window: a flood of
    short requests took ~5 points over its share so). Here a round asks for a 10 s wait; a wake ends it."""
    rounds: list[float] = []
    with _round_counting_loop(World(unique_key(), Clock(T0_US), 1.0, Users()), rounds) as loop:
        deadline = time.monotonic() + 5
        while not rounds and time.monotonic() < deadline:
            time.sleep(0.01)
        woken = time.monotonic()
        loop.wake()
        while len(rounds) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(rounds) == 2 and rounds[1] - woken < 2.0, rounds


def test_wakes_as_fast_as_a_client_can_send_them_buy_a_round_per_wake_gap_at_most() -> None:
    """Every request a client starts through the front proxy may wake the pacing thread (real-time priority): a
    thread waking it without pause for 1 s gets at most one round per PACE_WAKE_GAP_US (the code before ran a
    round per wake: tens of thousands here)."""
    rounds: list[float] = []
    with _round_counting_loop(World(unique_key(), Clock(T0_US), 1.0, Users()), rounds) as loop:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:
            loop.wake()
            time.sleep(0)  # the loop's thread takes the interpreter between wakes, as with the proxy's own thread
        elapsed_us = (time.monotonic() - t0) * 1e6
    assert 10 <= len(rounds) <= elapsed_us / budgets.PACE_WAKE_GAP_US + 5, len(rounds)


def test_a_demand_rise_wakes_the_pace_loop_only_where_it_can_matter() -> None:
    """The front proxy's DEMAND rise (`demand_rose`) wakes the pace loop where deciding at once can change what the
    engine may do: a peer with DEMAND, or a v1 member, makes a schedule with us; a stopped engine may be due to run.
    Alone (or beside idle peers) the engine runs unpaced whatever a round decides, and no round is spent on it (the
    code before woke one for every request: ~150-300 µs of CPU each, caches cold, beside a busy engine)."""
    clock = Clock(T0_US)
    w = World(unique_key(), clock, 1.0, Users())
    stopped = [False]
    rounds: list[float] = []

    def woke(wait_s: float) -> bool:
        """A request's DEMAND rises and ends: did a round follow within `wait_s`?"""
        n = len(rounds)
        w.me.set_demand(True)
        loop.demand_rose()
        w.me.set_demand(False)
        deadline = time.monotonic() + wait_s
        while len(rounds) == n and time.monotonic() < deadline:
            time.sleep(0.005)
        return len(rounds) > n

    with _round_counting_loop(w, rounds, stopped=lambda: stopped[0], clock_us=clock) as loop:
        deadline = time.monotonic() + 5
        while not rounds and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rounds
        assert not woke(0.3)  # alone
        w.write_peer(1, Peer(1.0, abi.FLAG_EXT1, 0, None))
        assert not woke(0.3)  # beside an idle Extension-1 peer
        w.write_peer(2, Peer(1.0, EXT1_DEMAND, 0, None))
        assert woke(5.0)  # a peer with DEMAND: a schedule with us from now on
        w.write_peer(2, None)
        w.write_peer(3, Peer(1.0, 0, 0, None))  # a v1 peer, active (World writes active=1): §5 for everyone
        assert woke(5.0)
        w.write_peer(3, None)
        assert not woke(0.3)
        stopped[0] = True  # stopped by us (its window ended with work in flight): it may be due to run
        assert woke(5.0)


def test_a_request_between_two_rounds_counts_its_span_as_busy() -> None:
    """A request that starts and ends between two rounds of the pace loop (no round woken for it: the engine is
    alone) counts the span it fell in as device time (busy_total_us, the priority meter), as a span with DEMAND
    at either end does: a lone engine serving short requests is busy, not idle, in what it publishes."""
    clock = Clock(T0_US)
    w = World(unique_key(), clock, 1.0, Users())
    try:
        loop, _ = flagged_loop(w.me, clock, clock.sleep, demand_exact=True)
        loop.step()
        clock.advance_to(clock.t + 25_000)
        loop.step()
        assert w.me.busy_total_us == 0  # idle
        clock.advance_to(clock.t + 10_000)
        w.me.set_demand(True)
        loop.demand_rose()
        clock.advance_to(clock.t + 5_000)
        w.me.set_demand(False)
        clock.advance_to(clock.t + 10_000)
        loop.step()
        assert w.me.busy_total_us == 25_000
        clock.advance_to(clock.t + 25_000)
        loop.step()
        assert w.me.busy_total_us == 25_000  # idle again: counted once
    finally:
        w.close()


# peers' changes for the reuse test: a new state, None (it leaves) or "beat" (its heartbeat rewritten, nothing
# else); a peer not named ages (dead 3 s after its last write); a new user for a slot (its bytes unchanged); our
# DEMAND set, cleared, or as it was; then that many rounds this far apart, nothing written meanwhile
reuse_steps = st.tuples(
    st.dictionaries(st.sampled_from(PEER_SLOTS), st.none() | peers | st.just("beat"), max_size=3),
    st.none() | st.tuples(st.sampled_from(PEER_SLOTS), st.sampled_from([1000, 1001, None])),
    st.sampled_from([None, True, False]),
    st.integers(1, 60),
    st.sampled_from([1_000, 25_000, 90_000, 700_000]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(T0_US, T0_US + 10_000_000), st.lists(reuse_steps, min_size=1, max_size=12), st.booleans())
def test_a_pace_loop_keeping_its_decision_acts_and_publishes_as_one_deciding_afresh(
    t0: int, steps: list, interactive: bool
) -> None:
    """The reader keeps its decision while the slots, their users and their aliveness stay as they were, and a
    batch owner's bits are not computed again then: a pace loop doing so decides, acts and publishes exactly as
    one deciding and publishing afresh at every round (`reuse` False: the code before), through peers joining,
    leaving, ageing out, coming back, changing users, and our DEMAND rising and falling."""
    users = Users()
    ca, cb = Clock(t0), Clock(t0)
    wa, wb = World(unique_key(), ca, 1.0, users), World(unique_key(), cb, 1.0, users)
    try:
        la, _ = flagged_loop(wa.me, ca, ca.sleep, users=users, demand_exact=True)
        lb, _ = flagged_loop(wb.me, cb, cb.sleep, users=users, demand_exact=True)
        lb._source.reuse = False
        for w in (wa, wb):
            w.me.set_interactive(interactive)
            w.clock.beating = None  # no heartbeat of ours: the registry stays unchanged between the history's writes
        for n, (changes, user, demand, rounds, dt) in enumerate(steps):
            for slot, change in changes.items():
                peer = wa.present.get(slot) if change == "beat" else change
                if change == "beat" and peer is None:
                    continue
                assert not isinstance(peer, str)
                users.of[slot] = peer.uid if peer is not None else None
                wa.write_peer(slot, peer)
                wb.write_peer(slot, peer)
            if user is not None:
                users.of[user[0]] = user[1]
            if demand is not None:
                wa.me.set_demand(demand)
                wb.me.set_demand(demand)
            for k in range(rounds):
                ca.advance_to(ca.t + dt)
                cb.advance_to(cb.t + dt)
                la.step()
                lb.step()
                assert la.decision == lb.decision, f"step {n} round {k}"
                assert la.action == lb.action, f"step {n} round {k}"
                assert wa.our_bits() == wb.our_bits(), f"step {n} round {k}"
                assert la.policy.hold_off.distrusted == lb.policy.hold_off.distrusted, f"step {n} round {k}"
                assert wa.seg.read_slot(0).busy_ppm == wb.seg.read_slot(0).busy_ppm, f"step {n} round {k}"
            event(f"mode: {la.decision.mode if la.decision else None}")
    finally:
        wa.close()
        wb.close()


def test_an_unchanged_registry_is_not_decided_again_at_each_expiry(monkeypatch) -> None:
    """Beside an idle peer nothing changes for seconds: the decision made once is kept at each DECIDE_TTL_US
    expiry (the code before decided afresh every 100 ms), and made again as soon as the peer ages out (3 s after
    its last heartbeat, within one expiry) or its user changes."""
    from gpushare_tui.core.pacing import pacer as pacer_

    decided: list[int] = []
    decide = pacer_.schedule_ext2.decide
    monkeypatch.setattr(pacer_.schedule_ext2, "decide", lambda *a: decided.append(1) or decide(*a))
    clock = Clock(T0_US)
    users = Users()
    w = World(unique_key(), clock, 1.0, users)
    try:
        users.of[1] = 1000
        w.write_peer(1, Peer(1.0, abi.FLAG_EXT1, 0, 1000))
        w.me.set_demand(True)
        loop, _ = flagged_loop(w.me, clock, clock.sleep, users=users, demand_exact=True)
        clock.beating = None  # our own heartbeat rewrites our slot: a new read, not an expiry
        loop.step()
        decided.clear()
        for _ in range(40):  # 1 s of 25 ms rounds: ten expiries
            clock.t += 25_000
            loop.step()
        assert decided == []
        users.of[1] = 1001  # its user as read now: decided again at the next expiry
        for _ in range(4):
            clock.t += 25_000
            loop.step()
        assert len(decided) == 1
        d = loop.decision
        assert d is not None and d.members == (0,)
        clock.t = T0_US + abi.ALIVE_US + 1  # the peer's last heartbeat is now 3 s old: dead
        loop.step()
        assert len(decided) == 2
    finally:
        w.close()
