"""core.rate.StepRate: tok/s over windows of work, and the best rate reached alone (pure, fake clock)."""

from __future__ import annotations

import pytest

from gpushare_tui.core.pacing.rate import StepRate


def test_rate_is_unknown_until_a_window_completes() -> None:
    r = StepRate(1.0)
    assert r.rate is None and r.solo is None
    assert not r.update(0.0, 0, lambda: False)
    assert not r.update(0.5, 50, lambda: False) and r.rate is None  # half a window: not measured yet
    assert r.update(1.0, 100, lambda: False) and r.rate == pytest.approx(100.0)
    assert r.solo is None  # shared at both edges: not a solo rate


def test_idle_reads_zero_and_is_not_averaged_into_the_next_window() -> None:
    r = StepRate(1.0)
    r.update(0.0, 0, lambda: False)
    r.update(1.0, 100, lambda: False)
    r.idle()
    assert r.rate == 0.0  # not producing
    r.update(11.0, 100, lambda: False)  # resumes 10 s later: a new window opens
    assert r.rate is None  # "-", not a 0 that reads as stalled while it works
    r.update(12.0, 200, lambda: False)
    assert r.rate == pytest.approx(100.0)  # not 100 steps / 11 s


def test_solo_is_the_best_rate_of_a_window_spent_alone() -> None:
    r = StepRate(1.0)
    alone = iter([True, True, True, False, False, True])
    r.update(0.0, 0, lambda: next(alone))
    r.update(1.0, 200, lambda: next(alone))  # alone at both edges: 200
    r.update(2.0, 350, lambda: next(alone))  # alone: 150 (worse: the best stays)
    assert (r.rate, r.solo) == (pytest.approx(150.0), pytest.approx(200.0))
    r.update(3.0, 560, lambda: next(alone))  # ended shared: 210 is no solo rate (and within 25 %: kept)
    r.update(4.0, 640, lambda: next(alone))  # began shared
    r.update(5.0, 720, lambda: next(alone))  # began shared, ended alone
    assert r.solo == pytest.approx(200.0)


def test_a_window_shared_for_part_of_it_is_no_solo_rate() -> None:
    """Alone at both edges but not in between (another engine worked mid-window): a shared rate, which
    as the solo reference would make every later speed vs solo read high (SPD% 152 at a 1:2 share)."""
    r = StepRate(1.0, alone_check_s=0.25)
    asked: list[float] = []
    state = {"alone": True}

    def alone() -> bool:
        asked.append(t)
        return state["alone"]

    t = 0.0
    r.update(t, 0, alone)
    for t, n, a in ((0.3, 10, False), (0.6, 20, True), (1.0, 40, True)):
        state["alone"] = a
        r.update(t, n, alone)
    assert r.rate == pytest.approx(40.0) and r.solo is None  # shared at 0.3 s
    assert asked == [0.0, 0.3, 1.0]  # once shared, not asked again until the edge
    for t, n in ((1.3, 140), (1.6, 240), (2.0, 340)):  # alone throughout: a solo window
        r.update(t, n, alone)
    assert r.solo == pytest.approx(300.0)
    assert asked == [0.0, 0.3, 1.0, 1.3, 1.6, 2.0]
    for t, n in ((2.1, 350), (2.2, 360)):  # checks at most every alone_check_s
        r.update(t, n, alone)
    assert asked[-1] == 2.0


def test_a_solo_rate_that_a_shared_window_beats_is_dropped() -> None:
    """Alone, but slowed by a load the registry does not show (a CPU hog): 100/s. Sharing later at 150/s
    would read SPD% 150; a shared rate cannot beat a true solo one, so the reference goes (SPD% -)
    until a new window alone; within 25 % it is noise and stays."""
    r = StepRate(1.0)
    alone = iter([True, True, False, False, False, True, True])
    r.update(0.0, 0, lambda: next(alone))
    r.update(1.0, 100, lambda: next(alone))
    assert r.solo == pytest.approx(100.0)
    r.update(2.0, 205, lambda: next(alone))  # shared, 105/s: within SOLO_BEATEN_RATIO, kept
    assert r.solo == pytest.approx(100.0)
    r.update(3.0, 355, lambda: next(alone))  # shared, 150/s: no solo rate was that
    assert r.solo is None
    r.update(4.0, 505, lambda: next(alone))  # shared
    r.update(5.0, 705, lambda: next(alone))  # began shared, ended alone: no solo window
    assert r.solo is None
    r.update(6.0, 905, lambda: next(alone))  # alone throughout: the new reference
    assert r.solo == pytest.approx(200.0)
