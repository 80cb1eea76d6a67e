"""The pacing policy's rules, one by one (core/pacing/policy.py; pure: slots built here, the clock a number).
Each test pins one rule and fails when that rule is dropped or changed: §5's windows and the lead, unpaced,
the floor over time and the owed run (planned, not late), the wait for priority (slices, owing nothing),
PRIORITY's hysteresis against the plain or user share, the USERS bit, the waiting member's check and §7's
re-read cadence."""

from __future__ import annotations

from gpushare_tui.core.pacing import policy
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.abi import SlotRecord
from gpushare_tui.core.schedule import ext1 as schedule_ext1
from gpushare_tui.core.schedule import ext2 as schedule_ext2
from gpushare_tui.core.schedule import v1 as schedule

T0 = 1_800_000_000_000_000 - 1_800_000_000_000_000 % 240_000  # a period boundary of 80, 120 and 240 ms
DEMAND = abi.FLAG_EXT1 | abi.FLAG_DEMAND
PRIO = DEMAND | abi.FLAG_INTERACTIVE | abi.FLAG_PRIORITY


def slot(i: int, weight: float = 1.0, flags: int = DEMAND, busy_ppm: int = 0, now: int = T0) -> SlotRecord:
    return SlotRecord(i, 100 + i, 0, 1, weight, 1, now, busy_ppm, b"\0" * abi.NAME_BYTES, flags=flags)


def decide(*slots: SlotRecord, now: int = T0, uids: dict[int, int | None] | None = None) -> schedule_ext2.Decision:
    return schedule_ext2.decide(slots, now, uids or {})


TWO_TO_ONE = (slot(0, 2.0), slot(1, 1.0))  # period 120 ms: slot 0 [0, 80) ms, slot 1 [80, 120) ms


# -- §5's windows ------------------------------------------------------------------------------------------


def test_in_its_window_it_runs_until_the_windows_end_less_the_lead() -> None:
    d = decide(*TWO_TO_ONE)
    a = policy.PacingPolicy().act(d, 0, T0 + 10_000, 0, lead_us=500)
    assert (a.kind, a.until_us, a.scheduled) == (policy.RUN, T0 + 80_000 - 500, True)


def test_outside_its_window_it_stops_until_the_next_one_starts() -> None:
    d = decide(*TWO_TO_ONE)
    p = policy.PacingPolicy()
    a = p.act(d, 1, T0 + 10_000, 0)
    assert (a.kind, a.until_us) == (policy.STOP, T0 + 80_000)
    assert p.stopped
    a = p.act(d, 0, T0 + 80_000 - 200, 0, lead_us=500)  # within the lead of its end: the next window
    assert (a.kind, a.until_us) == (policy.STOP, T0 + 120_000)


def test_alone_or_not_a_member_it_runs_unpaced_and_owes_nothing() -> None:
    p = policy.PacingPolicy()
    d = decide(*TWO_TO_ONE)
    p.act(d, 1, T0 + 10_000, 0)  # stopped for 70 ms
    assert p.act(decide(slot(0)), 0, T0 + 20_000, 10_000).kind == policy.UNPACED  # alone: no schedule
    assert not p.stopped and p.owed_us == 0
    assert p.act(d, 5, T0, 0).kind == policy.UNPACED  # slot 5 is no member


# -- the floor over time and the owed run ------------------------------------------------------------------


def test_a_stop_is_never_longer_than_the_floor_allows() -> None:
    """A window kept just behind `now` (a peer re-weighting at every read) would stop us forever; the floor
    ends the stop after (1 - f) * period and the run then owed is run, outside the window too."""
    d = decide(*TWO_TO_ONE)
    sched = d.schedule
    assert sched is not None
    longest = schedule.longest_sleep_us(sched)  # 0.9 * 120 ms + 2 ms
    p = policy.PacingPolicy()
    assert p.act(d, 1, T0 + 120_000, 0).until_us == T0 + 200_000  # an honest stop: 80 ms, within the floor
    # 100 ms on, our window seen 60 ms away again (it moved): the stop ends when the floor says, not then
    a = p.act(d, 1, T0 + 240_000 + 20_000, 100_000)
    assert (a.kind, a.until_us) == (policy.STOP, T0 + 240_000 + 20_000 + longest - 100_000)
    a = p.act(d, 1, T0 + 240_000 + 30_000, longest)  # outside our window, stopped `longest`: run what is owed
    owed = schedule.owed_run_us(sched, longest)
    assert (a.kind, a.scheduled, a.until_us) == (policy.RUN, False, T0 + 240_000 + 30_000 + owed)
    assert p.owed_us == owed > 0


def test_the_owed_run_is_run_before_the_next_stop_and_shrinks_as_it_runs() -> None:
    d = decide(*TWO_TO_ONE)
    sched = d.schedule
    assert sched is not None
    p = policy.PacingPolicy()
    p.act(d, 1, T0, 0)  # stopped 80 ms, until our window
    assert p.act(d, 1, T0 + 80_000, 80_000).kind == policy.RUN  # in our window: owed f/(1-f) of the stop
    owed = schedule.owed_run_us(sched, 80_000)
    assert p.owed_us == owed > 0
    p.ran(1, 80_000, 80_000 + 1_000, T0 + 80_000, T0 + 81_000)
    assert p.owed_us == owed - 1_000
    a = p.act(d, 1, T0 + 120_000, 81_000)  # our window ended: still owed, so it runs on
    assert (a.kind, a.scheduled) == (policy.RUN, False)


def test_a_late_wake_up_is_owed_by_no_one() -> None:
    """The owed run is f/(1-f) of the stop as planned, and ends when planned: the OS's lateness is not owed."""
    d = decide(*TWO_TO_ONE)
    sched = d.schedule
    assert sched is not None
    p = policy.PacingPolicy()
    p.act(d, 1, T0, 0)  # planned: 80 ms
    p.act(d, 1, T0 + 80_000 + 30_000, 110_000)  # woke 30 ms late
    assert p.owed_us == schedule.owed_run_us(sched, 80_000)
    planned_end = 80_000 + p.owed_us
    p.ran(1, planned_end, planned_end + 1_000, T0 + 120_000, T0 + 121_000)  # a run begun past its planned end
    assert p.owed_us == 0


def test_resumed_owes_what_the_stop_planned() -> None:
    d = decide(*TWO_TO_ONE)
    sched = d.schedule
    assert sched is not None
    p = policy.PacingPolicy()
    p.act(d, 1, T0, 0)
    p.resumed(95_000)
    assert not p.stopped and p.owed_us == schedule.owed_run_us(sched, 80_000)
    p.idle()
    assert p.owed_us == 0


# -- priority: the wait, the budget, the check ---------------------------------------------------------------


def test_a_member_waits_for_a_priority_member_in_growing_slices_owing_nothing() -> None:
    d = decide(slot(0, 1.0, PRIO), slot(1))
    p = policy.PacingPolicy()
    p.act(decide(*TWO_TO_ONE), 1, T0, 0)  # a §5 stop first
    slices = []
    for mono in (0, 4_000, 8_000, 16_000, 32_000, 52_000):
        a = p.act(d, 1, T0 + mono, mono)
        assert a.kind == policy.WAIT and not a.run
        slices.append(a.reread_us)
    assert slices == [4_000, 4_000, 8_000, 16_000, 20_000, 20_000]
    assert not p.stopped and p.owed_us == 0  # a wait is no §5 stop: nothing owed after it


def test_priority_follows_the_hysteresis_on_the_busy_against_the_plain_share() -> None:
    p = policy.PacingPolicy()
    slots = (slot(0, 1.0, PRIO), slot(1, 1.0))  # S = 1/2
    d = decide(*slots)
    flags = PRIO

    def publish(mono: int, flags: int) -> policy.Publish:
        return p.publish(d, slots, {}, 0, 1.0, flags, T0, mono)

    assert publish(0, flags).priority is True
    p.busy(100_000, 400_000)
    assert publish(100_000, flags) == policy.Publish(False, True, 400_000)  # at 0.8 S: kept (users unknown)
    p.busy(200_000, 1_000)
    assert publish(200_000, flags).priority is False  # over it: cleared, with the busy judged on
    assert publish(200_000, flags & ~abi.FLAG_PRIORITY).priority is False  # 40.1 %: not yet back
    p.busy(1_150_000, 0)  # the first 100 ms fell out of the last second: 1 ms busy
    assert publish(1_150_000, flags & ~abi.FLAG_PRIORITY).priority is True  # under 0.7 S: set again
    assert p.publish(d, slots, {}, 1, 1.0, DEMAND, T0, 0).priority is None  # a batch owner has none


def test_priority_is_judged_against_the_user_share_while_users_apply() -> None:
    """Extension 2: with user shares in force an owner's budget is its e_i, not its plain share."""
    ext2 = DEMAND | abi.FLAG_USERS
    slots = (slot(0, 1.0, PRIO | abi.FLAG_USERS), slot(1, 1.0, ext2), slot(2, 1.0, ext2))
    uids: dict[int, int | None] = {0: 1, 1: 1, 2: 2}  # us and slot 1 one user: e_0 = 1/4 (plain: 1/3)
    d = decide(*slots, uids=uids)
    assert d.users_applied
    p = policy.PacingPolicy()
    p.busy(0, 300_000)
    assert p.publish(d, slots, uids, 0, 1.0, PRIO | abi.FLAG_USERS, T0, 0).priority is False
    assert policy.own_share(decide(*slots), slots, 0, 1.0, {}, T0) == 1 / 3  # without users: the plain share


def test_the_users_bit_follows_whether_every_other_user_is_known() -> None:
    slots = (slot(0), slot(1), slot(2))
    assert policy.users_bit(slots, 0, {1: 1000, 2: 1001}, DEMAND, T0) is True
    assert policy.users_bit(slots, 0, {1: 1000, 2: None}, DEMAND, T0) is False
    assert policy.users_bit(slots, 0, {1: 1000, 2: 1001}, 0, T0) is None  # no EXT1: never ours to set
    p = policy.PacingPolicy()
    assert p.publish(None, slots, {1: 1000}, 0, 1.0, DEMAND, T0, 0).users is False


def test_the_waiting_member_stops_believing_a_holder_that_overstays() -> None:
    """A holder whose bit says priority with busy 0, for ever: after waiting more than its budget allows the
    waiting member decides as if none had priority (and runs by §5 over both)."""
    liar = slot(0, 1.0, PRIO)
    p = policy.PacingPolicy()
    kinds = []
    for k in range(200):  # 20 ms re-reads, 4 s
        now, mono = T0 + k * 20_000, k * 20_000
        slots = (slot(0, 1.0, PRIO, now=now), slot(1, now=now))
        d = p.judge(decide(*slots, now=now), 1, slots, now, mono)
        kinds.append(p.act(d, 1, now, mono).kind)
    assert kinds[0] == policy.WAIT and liar.flags & abi.FLAG_PRIORITY
    # believed again once the wait is back under half the allowance, so it alternates: over the last 2 s it
    # waits about (S_P * W + 50 ms) of each second at most, never all of it (a believed liar: 100 %)
    waited = kinds[100:].count(policy.WAIT) / 100
    assert 0 < waited <= 0.65 and p.hold_off.tripped >= 1, (waited, p.hold_off.tripped)


def test_an_interactive_peer_calls_for_the_fast_reread_while_we_may_run() -> None:
    batch = decide(*TWO_TO_ONE)
    inter = decide(slot(0, 2.0, DEMAND | abi.FLAG_INTERACTIVE), slot(1))
    p = policy.PacingPolicy()
    assert p.act(batch, 0, T0, 0).reread_us is None
    assert p.act(inter, 0, T0, 0).reread_us == schedule_ext1.REREAD_US
    alone = decide(slot(0, 1.0, DEMAND | abi.FLAG_INTERACTIVE))
    assert p.act(alone, 0, T0, 0, demand=True).reread_us == schedule_ext1.REREAD_US
    assert p.act(alone, 0, T0, 0, demand=False).reread_us is None  # no work: no need to notice it fast
