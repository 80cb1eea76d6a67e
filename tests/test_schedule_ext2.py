"""Spec §8 (Extension 2): the deciding function against tests/data/ext2-vectors.json, which an
independent implementation (tests/ext2_reference.py) generates."""

from __future__ import annotations

import json
import math

import ext2_reference
import pytest

from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.abi import SlotRecord
from gpushare_tui.core.schedule import ext1 as schedule_ext1
from gpushare_tui.core.schedule import ext2 as schedule_ext2
from testkit.paths import DATA

VECTORS = json.loads((DATA / "ext2-vectors.json").read_text())
CASES = VECTORS["cases"]
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _slots(case: dict) -> list[SlotRecord]:
    return [
        SlotRecord(
            index=i,
            pid=s["pid"],
            seq=0,
            boot_us=0,
            weight=NON_FINITE[s["weight"]] if isinstance(s["weight"], str) else abi.to_f32(float(s["weight"])),
            active=s["active"],
            heartbeat_us=s["heartbeat_us"],
            busy_ppm=s["busy_ppm"],
            name_raw=b"\0" * abi.NAME_BYTES,
            flags=s["flags"],
        )
        for i, s in enumerate(case["slots"])
    ]


def _uids(case: dict) -> dict[int, int | None]:
    return {int(k): v for k, v in case["uids"].items()}


def test_the_vectors_are_what_the_reference_computes() -> None:
    """The file is the second implementation's output (regenerate: python tests/ext2_reference.py)."""
    assert ext2_reference.main(["--check"]) == 0
    assert len(CASES) >= 20 and all(len(c["slots"]) == abi.SLOT_COUNT for c in CASES)
    assert {c["expect"]["users_applied"] for c in CASES} == {True, False}
    assert {c["expect"]["mode"] for c in CASES} == {"v1", "ext1", "priority"}


def test_the_users_bit_is_the_next_free_flag() -> None:
    assert abi.FLAG_USERS == 1 << ext2_reference.BIT["USERS"] == abi.FLAG_PRIORITY << 1


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_ext2_vector(case: dict) -> None:
    now, exp, slots, uids = case["now_us"], case["expect"], _slots(case), _uids(case)
    d = schedule_ext2.decide(slots, now, uids)
    assert (d.mode, d.users_applied, d.fallback) == (exp["mode"], exp["users_applied"], exp["fallback"])
    assert list(d.members) == exp["members"]
    assert list(d.priority) == exp["priority"]
    assert {str(k): v for k, v in d.user_shares} == exp["user_shares"]  # bit for bit
    if exp["period_us"] is None:
        assert d.schedule is None
    else:
        assert d.schedule is not None and d.schedule.period_us == exp["period_us"]
        assert {str(s): list(w) for s, w in zip(d.schedule.slots, d.schedule.windows_us, strict=True)} == exp["windows"]
    for slot_s, may in exp["may_run"].items():
        assert d.may_run(int(slot_s), now) is may, slot_s
    for slot_s, keeps in exp["keeps_users_bit"].items():
        assert schedule_ext2.verifies_all_others(slots, int(slot_s), uids, now) is keeps, slot_s


@pytest.mark.parametrize("case", [c for c in CASES if not c["expect"]["users_applied"]], ids=lambda c: c["name"])
def test_a_fallback_is_section_7_unchanged(case: dict) -> None:
    slots, now = _slots(case), case["now_us"]
    d, d1 = schedule_ext2.decide(slots, now, _uids(case)), schedule_ext1.decide(slots, now)
    assert (d.mode, d.schedule, d.members, d.priority, d.v1_peer) == (
        d1.mode,
        d1.schedule,
        d1.members,
        d1.priority,
        d1.v1_peer,
    )


def test_ext1_vectors_decide_as_section_7_without_uids() -> None:
    """Every §7 vector (no USERS bit anywhere) decides exactly as §7 does, whatever uids say."""
    import test_schedule_ext1 as t1

    for case in t1.CASES:
        slots, now = t1._slots(case), case["now_us"]
        d = schedule_ext2.decide(slots, now, {s.index: 0 for s in slots})
        assert d.schedule is schedule_ext1.decide(slots, now).schedule and not d.users_applied, case["name"]


@pytest.mark.parametrize("v", VECTORS["own_shares"], ids=lambda v: f"case{v['case']}-slot{v['slot']}")
def test_own_user_share(v: dict) -> None:
    case = CASES[v["case"]]
    got = schedule_ext2.user_share(_slots(case), v["slot"], v["weight"], _uids(case), VECTORS["now_base_us"])
    assert got == v["expect"]


def test_a_distrusted_priority_keeps_the_user_shares() -> None:
    """A waiting member that judges the holders' priority over budget (ext1.HoldOffCheck) decides without
    it (ext2.judged): over §8's user shares when they are in force, else as the check decided (§5 over
    every member); a priority believed leaves the decision as it is."""
    from gpushare_tui.core.schedule import v1 as schedule

    with_priority = [c for c in CASES if c["expect"]["priority"]]
    assert any(c["expect"]["users_applied"] for c in with_priority)
    for case in CASES:
        slots, now = _slots(case), case["now_us"]
        d = schedule_ext2.decide(slots, now, _uids(case))
        assert schedule_ext2.judged(d, d) is d
        fair = schedule_ext1.decide(slots, now, ignore_priority=True)
        j = schedule_ext2.judged(d, fair)
        assert j.priority == () and j.members == d.members, case["name"]
        if d.users_applied:
            assert j.users_applied and j.user_shares == d.user_shares, case["name"]
            assert j.schedule == (schedule.build_schedule(list(d.user_shares)) if d.user_shares else None)
        else:
            assert (j.schedule, j.fallback, j.users_applied) == (fair.schedule, d.fallback, False), case["name"]
