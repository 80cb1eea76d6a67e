"""The pacing policy's §5 windows (pure) with the supervisor's lead: run inside the window, stop a lead before
its end."""

from __future__ import annotations

from gpushare_tui.core.engines.pace_loop import STOP_LEAD_US
from gpushare_tui.core.pacing import policy
from gpushare_tui.core.schedule import v1 as schedule

BASE_US = 1_800_000_000_000_000 - 1_800_000_000_000_000 % 120_000  # a period boundary
SCHED = schedule.build_schedule([(0, 2.0), (1, 1.0)])  # period 120 ms: slot 0 [0, 80) ms, slot 1 [80, 120) ms


def run_until(sched: schedule.Schedule | None, slot: int, now_us: int, stop_lead_us: int = STOP_LEAD_US):
    assert sched is not None
    return policy.run_until(sched, slot, now_us, stop_lead_us)


def test_schedule_under_test() -> None:
    assert SCHED is not None and SCHED.period_us == 120_000
    assert SCHED.window_of(0) == (0, 80_000) and SCHED.window_of(1) == (80_000, 120_000)


def test_runs_inside_its_window_until_the_stop_lead() -> None:
    assert run_until(SCHED, 0, BASE_US) == (True, BASE_US + 80_000 - STOP_LEAD_US)
    assert run_until(SCHED, 0, BASE_US + 79_000) == (True, BASE_US + 80_000 - STOP_LEAD_US)
    assert run_until(SCHED, 1, BASE_US + 80_000) == (True, BASE_US + 120_000 - STOP_LEAD_US)


def test_stops_within_the_lead_before_its_window_ends() -> None:
    last_us = BASE_US + 80_000 - 1
    assert run_until(SCHED, 0, BASE_US + 80_000 - STOP_LEAD_US) == (False, BASE_US + 120_000)
    assert run_until(SCHED, 0, last_us) == (False, BASE_US + 120_000)
    assert run_until(SCHED, 0, last_us, stop_lead_us=0) == (True, BASE_US + 80_000)


def test_stopped_outside_its_window_until_the_next_start() -> None:
    assert run_until(SCHED, 0, BASE_US + 80_000) == (False, BASE_US + 120_000)
    assert run_until(SCHED, 1, BASE_US + 10) == (False, BASE_US + 80_000)
    assert run_until(SCHED, 1, BASE_US + 120_000 - 100) == (False, BASE_US + 200_000)


def test_never_two_engines_running_at_once() -> None:
    for t in range(BASE_US, BASE_US + 240_000, 250):
        assert sum(run_until(SCHED, s, t)[0] for s in (0, 1)) <= 1
