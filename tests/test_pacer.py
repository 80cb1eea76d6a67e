"""In-process pacer (spec §5.7) with an injected clock and sleep, and a second owner in the segment."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.pacing import edges
from gpushare_tui.core.pacing.pacer import Pacer
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.registry.segment import Segment
from gpushare_tui.core.schedule import v1 as schedule
from testkit.shm import shm_file

OTHER_PID = 3_999_500
PERIOD = 120_000  # weights 2 (us, slot 0) : 1 (other, slot 1) -> [0, 80000) [80000, 120000)


class World:
    """Our membership + pacer on a fake clock, and a second owner writing its own slot."""

    def __init__(self, key: str) -> None:
        self.t = wall_us() // PERIOD * PERIOD  # a period boundary
        self.sleeps: list[float] = []
        self.active_when_sleeping: list[int] = []
        self.m = Membership(key, 2.0, "me", clock_us=self.clock, mono_us=self.clock, heartbeat_s=3600)
        self.m.join()
        assert self.m.slot == 0
        self.pacer = Pacer(self.m, clock_us=self.clock, mono_us=self.clock, sleep_s=self.sleep)
        self.other = Segment.create_or_attach(key)
        self.ro = Segment.attach_readonly(shm_file(key))

    def clock(self) -> int:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.active_when_sleeping.append(self.ro.read_slot(0).active)
        self.t += round(s * 1e6)

    def other_peer(self, *, active: int = 1, age_us: int = 0, weight: float = 1.0) -> None:
        self.other.cas_pid(1, 0, OTHER_PID)
        self.other.write_slot_fields(
            1,
            boot_us=1,
            weight=weight,
            active=active,
            heartbeat_us=self.t - age_us,
            busy_ppm=0,
            name_raw=abi.encode_name("other"),
        )

    def at(self, pos: int) -> None:
        """Move the clock forward to phase `pos` of the next period."""
        self.t = (self.t // PERIOD + 1) * PERIOD + pos

    def close(self) -> None:
        self.m.leave()
        self.other.close()
        self.ro.close()


@pytest.fixture
def world(gpu_key: str) -> Iterator[World]:
    w = World(gpu_key)
    yield w
    w.close()


def test_outside_window_sleeps_exactly_until_next_window(world: World) -> None:
    world.other_peer()
    world.at(100_000)  # the other peer's window
    now = world.t
    slept = world.pacer.step_done(step_us=5000)
    assert world.sleeps == [0.02]  # until 120000 = our next window start
    assert slept == 20_000 == world.pacer.total_slept_us
    assert world.t == now + 20_000 and world.t % PERIOD == 0
    assert world.active_when_sleeping == [1]  # active was raised before the schedule was computed


def test_window_end_is_exclusive_and_start_of_next_is_in_next_period(world: World) -> None:
    world.other_peer()
    world.at(80_000)
    assert world.pacer.step_done() == 40_000
    assert world.sleeps == [0.04]
    world.at(79_999)
    assert world.pacer.step_done() == 0  # still ours
    assert world.sleeps == [0.04]


def test_inside_window_never_sleeps(world: World) -> None:
    world.other_peer()
    for pos in (0, 1, 40_000, 79_999):
        world.at(pos)
        world.other_peer()  # keep the other peer's heartbeat fresh on the fake clock
        assert world.pacer.step_done() == 0
    assert world.sleeps == []


def test_the_other_peer_sleeps_for_our_window(gpu_key: str, world: World) -> None:
    # from the other peer's point of view (slot 1, weight 1): its window is [80000, 120000)
    world.m.mark_active(world.t)
    sleeps: list[float] = []
    t = [world.t]

    def sleep(s: float) -> None:
        sleeps.append(s)
        t[0] += round(s * 1e6)

    clock = lambda: t[0]  # noqa: E731
    with Membership(gpu_key, 1.0, "peer", pid=OTHER_PID + 1, clock_us=clock, mono_us=clock, heartbeat_s=3600) as m2:
        assert m2.slot == 1
        p2 = Pacer(m2, clock_us=clock, mono_us=clock, sleep_s=sleep)
        t[0] = (t[0] // PERIOD + 1) * PERIOD + 10_000
        world.t = t[0]
        world.m.mark_active(t[0])
        world.m.set_demand(True)  # an Extension-1 member has work in flight (spec §7)
        assert p2.step_done() == 70_000
        assert sleeps == [0.07]


def test_alone_never_sleeps(world: World) -> None:
    for pos in range(0, PERIOD, 7_000):
        world.at(pos)
        assert world.pacer.step_done() == 0
    assert world.sleeps == []
    assert world.ro.read_slot(0).active == 1


def test_idle_other_peer_does_not_throttle(world: World) -> None:
    world.other_peer(active=0)
    world.at(100_000)
    assert world.pacer.step_done() == 0
    assert world.sleeps == []
    world.other_peer(active=1)  # it starts decoding: now we are paced
    assert world.pacer.step_done() == 20_000


def test_dead_other_peer_does_not_throttle(world: World) -> None:
    world.at(100_000)
    world.other_peer(age_us=3_000_001)
    assert world.pacer.step_done() == 0
    world.other_peer(age_us=3_000_000)  # exactly 3 s is still alive
    assert world.pacer.step_done() == 20_000


def test_invalid_weight_other_peer_does_not_throttle(world: World) -> None:
    world.at(100_000)
    world.other_peer(weight=float("nan"))
    assert world.pacer.step_done() == 0
    world.other_peer(weight=0.0)
    assert world.pacer.step_done() == 0


def test_first_step_raises_active(world: World) -> None:
    assert world.ro.read_slot(0).active == 0
    world.pacer.step_done()
    assert world.ro.read_slot(0).active == 1


def test_busy_fraction_is_published(world: World) -> None:
    # alone: 5 ms of work every 10 ms for > 1 s -> busy 50%
    for _ in range(110):
        world.t += 10_000
        world.pacer.step_done(step_us=5_000)
    world.m.heartbeat()
    assert world.ro.read_slot(0).busy_ppm == pytest.approx(500_000, rel=0.02)


def test_busy_after_an_idle_spell_is_not_averaged_over_it(world: World) -> None:
    # 50% busy, then 10 s idle (the registry drops `active` and zeroes busy), then 50% busy again:
    # within 0.3 s of resuming the published busy is ~50% (a partial window), not the ~1% of a window
    # that would span the idle spell
    for _ in range(110):
        world.t += 10_000
        world.pacer.step_done(step_us=5_000)
    world.m.heartbeat()
    assert world.ro.read_slot(0).busy_ppm == pytest.approx(500_000, rel=0.02)
    world.t += 10_000_000
    world.m.heartbeat()  # more than the activity window since the last step: idle
    assert (world.ro.read_slot(0).active, world.ro.read_slot(0).busy_ppm) == (0, 0)
    for _ in range(30):
        world.t += 10_000
        world.pacer.step_done(step_us=5_000)
    world.m.heartbeat()
    rec = world.ro.read_slot(0)
    assert rec.active == 1 and rec.busy_ppm == pytest.approx(500_000, rel=0.1)


def test_busy_fraction_counts_time_between_steps_by_default(world: World) -> None:
    # no step_us: the time since step_done returned counts as busy; time slept does not
    world.other_peer()
    world.at(0)
    world.pacer._last_return_us = world.t  # start of measurement
    world.pacer._window_start_us = world.t
    start = world.t
    while world.t - start < 1_150_000:  # > 1 s of 2:1 periods -> busy ~ 2/3 (80 of every 120 ms)
        world.t += 4_000
        world.other_peer()
        world.pacer.step_done()
    assert world.pacer.total_slept_us > 0
    world.m.heartbeat()
    assert world.ro.read_slot(0).busy_ppm == pytest.approx(666_666, rel=0.1)


def test_a_moved_window_never_takes_the_floor(world: World) -> None:
    """The other member re-weights so that we wake outside our window again (issue 17): the pacer
    sleeps at most (1 - f) * period, then runs what it is owed before sleeping again."""
    world.other_peer(weight=1.0)  # 2 : 1, period 120 ms, our window [0, 80000)
    world.at(80_000)
    assert world.pacer.step_done(step_us=1000) == 40_000
    owed = schedule.owed_run_us(schedule.build_schedule([(0, 2.0), (1, 1.0)]), 40_000)
    assert owed > 0
    # at our window's start, a weight that puts "now" outside it (slot 1's window, by another period), and
    # still once the owed run is over (the phase of the moved period is the wall clock's: both checked)
    moved = next(
        w
        for w in (1.5, 2.5, 3.0, 4.0, 6.0, 8.0, 9.0, 5.0, 7.0, 3.5, 1.25, 1.75, 2.25, 2.75, 4.5, 5.5)
        if not any(
            schedule.may_run(schedule.build_schedule([(0, 2.0), (1, w)]), 0, world.t + dt)
            for dt in range(0, owed + 2000, 500)
        )
    )
    world.other_peer(weight=moved)
    world.pacer._sched_mono_us = None  # re-read now
    ran = 0
    while ran + 1000 < owed:  # each step_done reports a 1 ms step run
        ran += 1000
        assert world.pacer.step_done(step_us=1000) == 0, f"slept after running {ran} of {owed} µs owed"
        world.t += 1000
    world.other_peer(weight=moved)
    sched = schedule.build_schedule([(0, 2.0), (1, moved)])
    assert not schedule.may_run(sched, 0, world.t)
    slept = world.pacer.step_done(step_us=1000)
    assert 0 < slept <= schedule.longest_sleep_us(sched)


def test_busy_total_counts_step_time_in_our_window_never_sleeps(world: World) -> None:
    """busy_total_us (spec §7): the steps' time inside our window; the overshoot past its end is the
    next member's; a sleep never counts; alone (no schedule) every step counts."""
    world.pacer.step_done(step_us=3000)  # alone: no schedule
    assert world.m.busy_total_us == 3000
    world.other_peer()
    world.at(50_000)
    world.pacer.step_done(step_us=1)  # re-reads the registry: the 2:1 schedule from here on
    world.other_peer()
    world.at(10_000)
    world.pacer.step_done(step_us=5000)
    assert world.m.busy_total_us == 3001 + 5000
    world.at(85_000)  # a step ending 5 ms past our window (80 ms): 5 ms of it was ours, then a sleep
    world.other_peer()
    world.pacer.step_done(step_us=10_000)
    assert world.sleeps == [0.035] and world.m.busy_total_us == 3001 + 5000 + 5000
    world.m.heartbeat()
    assert world.ro.read_slot(0).busy_total_us == 3001 + 5000 + 5000  # written at the heartbeat


def test_each_window_woken_into_is_recorded_with_its_steps(world: World) -> None:
    """Truth at every edge (core/pacing/edges.py): each window we woke into at its start is recorded at the stop
    after it, with its length, the wake-up's lateness, the last step's end after the window's and our steps."""
    world.other_peer()
    world.at(100_000)  # the other peer's window: we sleep until ours starts at 120000
    steps = 0
    while len(world.pacer.edges) < 3 and steps < 100:
        world.t += 7_000  # each step takes 7 ms
        world.other_peer()
        world.pacer.step_done(step_us=7_000)
        steps += 1
    ws = list(world.pacer.edges)
    assert len(ws) == 3 and steps == 1 + 3 * 12  # the first in its window; each recorded at the stop after its 12th
    for w in ws:
        assert w.scheduled_us == 80_000 and w.cont_late_us == 0
        # 12 steps end at 84 ms: the 12th began at 77 ms, inside the window, and ran 4 ms past its end
        assert w.ran_us == 12 * 7_000 and w.stop_late_us == 4_000
    r = edges.report(ws, world.t)
    assert r.windows == 3 and r.ran_pct == pytest.approx(105.0) and r.loss_per_edge_ms == pytest.approx(-2.0)
