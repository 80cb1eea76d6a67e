"""The pacer under Extension 1 (spec §7), on a fake clock: DEMAND raised at each step, a batch member
waits for a priority member (re-reading every WAIT_REREAD_US) and resumes when it goes, an
interactive owner's PRIORITY follows its busy by the hysteresis, and a v1 member puts it back on §5."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.pacing.pacer import Pacer
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.registry.segment import Segment
from gpushare_tui.core.schedule import ext1 as schedule_ext1
from testkit.shm import shm_file

OTHER_PID = 3_999_600


class Clock:
    def __init__(self) -> None:
        self.t = wall_us() // 1_000_000 * 1_000_000
        self.sleeps: list[float] = []
        self.on_sleep = lambda: None

    def __call__(self) -> int:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += round(s * 1e6)
        self.on_sleep()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def me(gpu_key: str, clock: Clock) -> Iterator[Membership]:
    m = Membership(gpu_key, 1.0, "me", clock_us=clock, mono_us=clock, heartbeat_s=3600, ext1=True)
    m.join()
    yield m
    m.leave()


@pytest.fixture
def other(gpu_key: str, me: Membership) -> Iterator[Segment]:
    seg = Segment.create_or_attach(gpu_key)
    seg.cas_pid(1, 0, OTHER_PID)
    yield seg
    seg.close()


def _write_other(seg: Segment, clock: Clock, flags: int, *, busy_ppm: int = 0, active: int = 1) -> None:
    seg.write_slot_fields(
        1,
        boot_us=1,
        weight=1.0,
        active=active,
        heartbeat_us=clock.t,
        busy_ppm=busy_ppm,
        name_raw=abi.encode_name("other"),
        flags=flags,
    )


def _flags(key: str, slot: int) -> int:
    with Segment.attach_readonly(shm_file(key)) as ro:
        return ro.read_slot(slot).flags


PRIO = abi.FLAG_EXT1 | abi.FLAG_INTERACTIVE | abi.FLAG_DEMAND | abi.FLAG_PRIORITY


def test_a_step_raises_demand_and_ext1(gpu_key: str, clock: Clock, me: Membership) -> None:
    pacer = Pacer(me, clock_us=clock, mono_us=clock, sleep_s=clock.sleep)
    assert _flags(gpu_key, 0) == abi.FLAG_EXT1
    pacer.step_done(1_000)
    # alone, it knows every other slot's user (there is none): USERS (Extension 2, §8.2) too
    assert _flags(gpu_key, 0) == abi.FLAG_EXT1 | abi.FLAG_DEMAND | abi.FLAG_USERS
    assert pacer.decision is not None and pacer.decision.mode == "ext1"


def test_a_batch_member_waits_for_a_priority_member_and_resumes(
    gpu_key: str, clock: Clock, me: Membership, other: Segment
) -> None:
    pacer = Pacer(me, clock_us=clock, mono_us=clock, sleep_s=clock.sleep)
    _write_other(other, clock, PRIO)
    waits = []

    def leave_after_50ms() -> None:
        waits.append(clock.t)
        if len(waits) == 5:
            _write_other(other, clock, PRIO & ~abi.FLAG_DEMAND)  # its work ended
        else:
            _write_other(other, clock, PRIO)  # heartbeat

    clock.on_sleep = leave_after_50ms
    slept = pacer.step_done(1_000)
    # slices of 4 ms at first, about doubling with the wait, at most WAIT_REREAD_US (wait_slice_us)
    assert clock.sleeps == [0.004, 0.004, 0.008, 0.016, schedule_ext1.WAIT_REREAD_US / 1e6]
    assert slept == 52_000 == pacer.total_waited_us
    assert _flags(gpu_key, 0) & abi.FLAG_DEMAND  # it kept DEMAND while waiting
    assert pacer.step_done(1_000) == 0  # alone again: runs


def test_a_v1_member_means_no_precedence(gpu_key: str, clock: Clock, me: Membership, other: Segment) -> None:
    pacer = Pacer(me, clock_us=clock, mono_us=clock, sleep_s=clock.sleep)
    _write_other(other, clock, PRIO)
    with Segment.create_or_attach(gpu_key) as raw:
        raw.cas_pid(2, 0, OTHER_PID + 1)
        raw.write_slot_fields(
            2, boot_us=1, weight=1.0, active=1, heartbeat_us=clock.t, busy_ppm=0, name_raw=abi.encode_name("v1")
        )
        clock.t = clock.t // 120_000 * 120_000 + 120_000  # §5 over 3 equal members: our window [0, 40000)
        me.mark_active(clock.t)
        assert pacer.step_done(1_000) == 0  # in our §5 window: the priority member gets no precedence
        d = pacer.decision
        assert d is not None and (d.mode, d.v1_peer) == ("v1", 2)
        raw.cas_pid(2, OTHER_PID + 1, 0)


def test_an_interactive_owner_loses_priority_over_budget_and_regains_it(
    gpu_key: str, clock: Clock, me: Membership, other: Segment
) -> None:
    me.set_interactive(True)
    pacer = Pacer(me, clock_us=clock, mono_us=clock, sleep_s=clock.sleep)
    _write_other(other, clock, abi.FLAG_EXT1 | abi.FLAG_DEMAND)  # a batch member with work: S = 1/2
    seen = []
    for _ in range(150):  # busy all along for 1.5 s (10 ms steps)
        clock.t += 10_000
        _write_other(other, clock, abi.FLAG_EXT1 | abi.FLAG_DEMAND)
        pacer.step_done(10_000)
        seen.append(me.priority)
    assert seen[0] and not seen[-1]  # had it, lost it once busy passed 0.8 * 1/2
    lost_at = seen.index(False)
    assert 36 <= lost_at <= 50, lost_at  # ~0.4 s of full busy
    assert _flags(gpu_key, 0) & abi.FLAG_PRIORITY == 0
    clock.t += 600_000  # idle: busy over the last second drops below 0.7 * 1/2
    _write_other(other, clock, abi.FLAG_EXT1 | abi.FLAG_DEMAND)
    pacer.step_done(1_000)
    assert me.priority and _flags(gpu_key, 0) & abi.FLAG_PRIORITY
    with Segment.attach_readonly(shm_file(gpu_key)) as ro:
        assert ro.read_slot(0).busy_ppm < 350_000  # published with the bit
