"""Spec §5: shares, water-filling window shares, period, windows, phase — bit-exact."""

from __future__ import annotations

import json
import math

import pytest

from gpushare_tui.core.observe.snapshot import build_gpu_snapshot
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.abi import SlotRecord
from gpushare_tui.core.schedule import v1 as schedule
from testkit.paths import DATA

VECTORS = json.loads((DATA / "tdm-vectors.json").read_text())
CASES = VECTORS["cases"]
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _weight(raw: float | str) -> float:
    """The slot's f32 field as read back: non-finite strings, else rounded to f32."""
    if isinstance(raw, str):
        return NON_FINITE[raw]
    return abi.to_f32(float(raw))


def _slots(case: dict) -> list[SlotRecord]:
    return [
        SlotRecord(
            index=i,
            pid=s["pid"],
            seq=0,
            boot_us=0,
            weight=_weight(s["weight"]),
            active=s["active"],
            heartbeat_us=s["heartbeat_us"],
            busy_ppm=0,
            name_raw=b"\0" * abi.NAME_BYTES,
        )
        for i, s in enumerate(case["slots"])
    ]


def test_vectors_file_is_the_spec_copy() -> None:
    assert VECTORS["spec"].startswith("registry-abi.md")
    assert len(CASES) >= 10
    assert all(len(c["slots"]) == abi.SLOT_COUNT for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_tdm_vector(case: dict) -> None:
    now = case["now_us"]
    exp = case["expect"]
    slots = _slots(case)

    members = schedule.member_weights(slots, now)
    assert [i for i, _ in members] == exp["members"]

    # share_pct: the plain ratio for members, 0 for every other occupied slot
    shares = dict(zip([i for i, _ in members], schedule.share_pct([w for _, w in members]), strict=True))
    for slot_s, pct in exp["share_pct"].items():
        assert shares.get(int(slot_s), 0.0) == pct, slot_s

    sched = schedule.build_schedule(members)
    if exp["period_ms"] is None:
        assert sched is None
        assert exp["windows"] == {}
    else:
        assert sched is not None
        assert sched.period_ms == exp["period_ms"]
        assert sched.period_us == 1000 * exp["period_ms"]
        assert {str(s): list(w) for s, w in zip(sched.slots, sched.windows_us, strict=True)} == exp["windows"]
        if "window_shares" in exp:
            assert {str(s): x for s, x in zip(sched.slots, sched.shares, strict=True)} == exp["window_shares"]

    for slot_s, may in exp["may_run"].items():
        assert schedule.may_run(sched, int(slot_s), now) is may, slot_s
    for slot_s, start in exp["next_start_us"].items():
        assert schedule.next_window_start_us(sched, int(slot_s), now) == start, slot_s

    # the snapshot (what every view and --json shows) agrees with the vector
    snap = build_gpu_snapshot("k", "/opencoti-gpu-k", slots, now)
    assert snap.period_ms == exp["period_ms"]
    by_slot = {p.slot: p for p in snap.peers}
    assert set(by_slot) == {i for i, s in enumerate(case["slots"]) if s["pid"] != 0}
    for slot_s, pct in exp["share_pct"].items():
        assert by_slot[int(slot_s)].share_pct == pct
    for slot_s, win in exp["windows"].items():
        assert list(by_slot[int(slot_s)].window_us) == win
    if sched is not None:  # who holds the window now: the snapshot's windows (the timeline) and may_run agree
        holder = schedule.holder_at(sched.period_us, ((p.slot, p.window_us) for p in snap.peers), now)
        assert [s for s in sched.slots if schedule.may_run(sched, s, now)] == [holder]


# -- spec §5 worked examples ---------------------------------------------------

WORKED = [
    ([2, 1], [200 / 3, 100 / 3], [2 / 3, 1 / 3], 120, [(0, 80000), (80000, 120000)]),
    ([1, 1], [50, 50], [1 / 2, 1 / 2], 80, [(0, 40000), (40000, 80000)]),
    ([2, 1, 1], [50, 25, 25], [1 / 2, 1 / 4, 1 / 4], 160, [(0, 80000), (80000, 120000), (120000, 160000)]),
    ([10, 1], [1000 / 11, 100 / 11], [0.9, 0.1], 400, [(0, 360000), (360000, 400000)]),
]


@pytest.mark.parametrize(("weights", "pct", "shares", "period", "windows"), WORKED, ids=["2:1", "1:1", "2:1:1", "10:1"])
def test_worked_examples(weights, pct, shares, period, windows) -> None:
    assert schedule.share_pct(weights) == pytest.approx(pct, abs=1e-9)
    assert [round(p, 2) for p in schedule.share_pct(weights)] == [round(p, 2) for p in pct]
    assert schedule.window_shares(weights) == pytest.approx(shares, abs=1e-12)
    sched = schedule.build_schedule(list(enumerate(weights)))
    assert sched is not None
    assert sched.period_ms == period
    assert list(sched.windows_us) == windows


# -- water-filling ---------------------------------------------------------------


def test_window_shares_plain_ratio_without_floor() -> None:
    assert schedule.window_shares([3.0, 1.0]) == [0.75, 0.25]
    assert schedule.window_shares([1.0]) == [1.0]
    assert schedule.window_shares([]) == []


def test_window_shares_floor_one_member() -> None:
    # 100:1 -> the small one is floored at 10%, the rest gets 90%
    assert schedule.window_shares([100.0, 1.0]) == pytest.approx([0.9, 0.1])
    # exactly at the floor is not raised
    assert schedule.window_shares([9.0, 1.0]) == pytest.approx([0.9, 0.1])


def test_window_shares_water_filling_cascades() -> None:
    # pass 1: only the 1 is below 10% (6/57 = 0.105 passes); pass 2 re-divides
    # 90% over {50, 6}: 0.9*6/56 = 0.096 < 0.1, so 6 is floored too.
    w = [50.0, 6.0, 1.0]
    one_pass = [0.9 * 50 / 56, 0.9 * 6 / 56, 0.1]
    got = schedule.window_shares(w)
    assert got == pytest.approx([0.8, 0.1, 0.1])
    assert got != pytest.approx(one_pass)
    # a case that stops after pass 2 (8 stays above the floor)
    got = schedule.window_shares([50.0, 8.0, 1.0])
    assert got == pytest.approx([0.9 * 50 / 58, 0.9 * 8 / 58, 0.1])


def test_window_shares_floor_is_one_over_n_for_many_members() -> None:
    w = [1.0, 2.0, 3.0] * 4  # 12 members: floor min(0.1, 1/12) = 1/12 -> all equal
    got = schedule.window_shares(w)
    assert got == pytest.approx([1 / 12] * 12)
    assert sum(got) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "weights", [[1, 1, 1, 1], [5, 1, 1], [1000, 1, 1, 1, 1], [0.25, 1.5, 0.75], list(range(1, 17))]
)
def test_window_shares_sum_to_one_and_respect_floor(weights) -> None:
    shares = schedule.window_shares([float(w) for w in weights])
    floor = min(0.1, 1 / len(weights))
    assert sum(shares) == pytest.approx(1.0)
    assert min(shares) >= floor - 1e-12
    # order is preserved: a larger weight never gets a smaller window
    for i in range(len(weights)):
        for j in range(len(weights)):
            if weights[i] > weights[j]:
                assert shares[i] >= shares[j] - 1e-12


def test_period_clamped_and_rounded() -> None:
    assert schedule.period_ms([0.5, 0.5]) == 80
    assert schedule.period_ms([0.75, 0.25]) == 160
    assert schedule.period_ms([0.9, 0.1]) == 400
    assert schedule.period_ms([1 / 12] * 12) == 400  # 480 clamped
    assert schedule.period_ms([0.9, 0.05, 0.05]) == 400
    assert schedule.period_ms([0.7, 0.3]) == 133  # floor(133.33 + 0.5)
    assert schedule.period_ms([0.6, 0.4]) == 100


def test_n_le_1_has_no_schedule() -> None:
    assert schedule.build_schedule([]) is None
    assert schedule.build_schedule([(3, 5.0)]) is None
    assert schedule.share_pct([7.0]) == [100.0]
    assert schedule.may_run(None, 3, 123) is True
    assert schedule.next_window_start_us(None, 3, 123) == 123


def test_window_boundaries_and_next_start() -> None:
    sched = schedule.build_schedule([(0, 2.0), (5, 1.0)])
    assert sched is not None and sched.period_us == 120_000
    base = 1_764_000_000_000_000 - 1_764_000_000_000_000 % 120_000
    # start is inclusive, end exclusive
    assert schedule.may_run(sched, 0, base) and not schedule.may_run(sched, 5, base)
    assert schedule.may_run(sched, 0, base + 79_999) and not schedule.may_run(sched, 0, base + 80_000)
    assert schedule.may_run(sched, 5, base + 80_000) and schedule.may_run(sched, 5, base + 119_999)
    # before our window in this period -> this period; after it -> one period later
    assert schedule.next_window_start_us(sched, 5, base + 10) == base + 80_000
    assert schedule.next_window_start_us(sched, 0, base + 80_000) == base + 120_000
    assert schedule.next_window_start_us(sched, 0, base + 119_999) == base + 120_000
    assert schedule.window_end_us(sched, 0, base + 5) == base + 80_000
    assert schedule.may_run(sched, 5, base + 100_000) and not schedule.may_run(sched, 0, base + 100_000)
    assert schedule.may_run(sched, 0, base + 1) and not schedule.may_run(sched, 5, base + 1)
    # non-members are never throttled by someone else's schedule
    assert schedule.may_run(sched, 9, base + 100_000) is True


def test_holder_at_is_the_window_containing_the_phase() -> None:
    windows = [(3, (0, 80_000)), (7, None), (5, (80_000, 100_000))]  # 7: no window; [100000, 120000): nobody's
    base = 1_764_000_000_000_000 - 1_764_000_000_000_000 % 120_000
    assert schedule.holder_at(120_000, windows, base) == 3
    assert schedule.holder_at(120_000, windows, base + 79_999) == 3
    assert schedule.holder_at(120_000, windows, base + 80_000) == 5  # start inclusive, end exclusive
    assert schedule.holder_at(120_000, windows, base + 100_000) is None
    assert schedule.holder_at(120_000, windows, base + 120_000 + 80_001) == 5  # the phase: t mod period
    assert schedule.holder_at(120_000, [], base) is None


def test_members_need_alive_active_and_valid_weight() -> None:
    now = 1_764_000_000_000_000

    def rec(i: int, **kw: object) -> SlotRecord:
        d = dict(pid=100 + i, seq=0, boot_us=1, weight=1.0, active=1, heartbeat_us=now - 1000, busy_ppm=0)
        d.update(kw)
        return SlotRecord(index=i, name_raw=b"", **d)  # type: ignore[arg-type]

    slots = [
        rec(0),
        rec(1, pid=0),  # free
        rec(2, heartbeat_us=now - 3_000_001),  # dead
        rec(3, heartbeat_us=now - 3_000_000),  # exactly 3 s: alive
        rec(4, active=0),  # idle
        rec(5, weight=math.nan),
        rec(6, weight=math.inf),
        rec(7, weight=0.0),
        rec(8, weight=-1.0),
        rec(9, weight=abi.to_f32(0.1)),
    ]
    assert schedule.member_weights(slots, now) == [(0, 1.0), (3, 1.0), (9, abi.to_f32(0.1))]
    # slot order, not list order
    assert [i for i, _ in schedule.member_weights(list(reversed(slots)), now)] == [0, 3, 9]


# -- the floor over time (issue 17) -------------------------------------------------


@pytest.mark.parametrize("weights", [[2, 1], [1, 1], [10, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]])
def test_an_honest_schedule_never_meets_the_floor_bounds(weights) -> None:
    """Every member's gap fits in longest_sleep_us, and the run owed after it fits in its window."""
    s = schedule.build_schedule(list(enumerate(map(float, weights))))
    assert s is not None
    for start, end in s.windows_us:
        gap_us = s.period_us - (end - start)
        assert gap_us <= schedule.longest_sleep_us(s) - schedule.FLOOR_SLACK_US + 1
        assert schedule.owed_run_us(s, gap_us + schedule.FLOOR_SLACK_US) <= end - start


@pytest.mark.parametrize("n", [2, 5, 16])
def test_the_longest_sleep_and_its_owed_run_are_the_floor(n: int) -> None:
    s = schedule.build_schedule([(i, 1.0 if i else 100.0) for i in range(n)])
    assert s is not None
    f = schedule.floor_share(n)
    sleep_us = schedule.longest_sleep_us(s)
    owed_us = schedule.owed_run_us(s, sleep_us)
    assert owed_us / (sleep_us + owed_us) == pytest.approx(f, rel=0.06)  # the slack costs < 6 % of it
    assert schedule.owed_run_us(s, schedule.FLOOR_SLACK_US) == 0
