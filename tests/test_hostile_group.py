"""Guarantees that hold against hostile group members (issue 17 item 3), played for real."""

from __future__ import annotations

import pytest

from gpushare_tui.core.schedule import v1 as schedule
from testkit.reweight import pacer_share, supervisor_share

# The floor of two members is 10 % of solo; on a noisy 2-core machine half of it is the bar
# (the fix measures ~9.5 %, the code before it ~1 % for the pacer and ~0 % for the supervisor).
FLOOR_TOLERANCE = 0.5


@pytest.mark.slow
def test_a_reweighting_member_never_takes_the_pacers_floor(gpu_key: str) -> None:
    share = pacer_share(gpu_key, seconds=3.0)
    assert share >= FLOOR_TOLERANCE * schedule.floor_share(2), f"ran {100 * share:.2f} % of the time"


@pytest.mark.slow
def test_a_reweighting_member_never_takes_the_supervised_engines_floor(gpu_key: str) -> None:
    continued, _cpu = supervisor_share(gpu_key, seconds=3.0)
    assert continued >= FLOOR_TOLERANCE * schedule.floor_share(2), f"continued {100 * continued:.2f} % of the time"
