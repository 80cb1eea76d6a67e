"""The SLO governor (core/pacing/governor.py): a pure rule, tested on figure sequences and on simulated engines
whose latency falls as their setting rises (one alone, and two whose targets cannot both hold)."""

from __future__ import annotations

import math
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare_tui.core.observe.latency import LatencyRecorder
from gpushare_tui.core.pacing.governor import (
    GOVERNOR_DOWN_AFTER_MAX_S,
    GOVERNOR_DOWN_AFTER_S,
    GOVERNOR_MANUAL_HOLD_S,
    GOVERNOR_MIN_REQUESTS,
    GOVERNOR_PRESS,
    GOVERNOR_UNREACHABLE_AFTER_S,
    GOVERNOR_WINDOW_S,
    Figures,
    Governor,
    GovernorBounds,
    GovernorConfigError,
    GovernorState,
    SloTarget,
    default_bounds,
    figures_of,
    initial_state,
    ladder,
    paused_s,
    rung_of,
    share_of,
    step,
)

TARGET = SloTarget(ttft_p99_ms=300)
BOUNDS = GovernorBounds(weight_min=1, weight_max=8)


def fig(ttft_ms: float | None, n: int = 20, itl_ms: float | None = None) -> Figures:
    return Figures(ttft_ms, itl_ms, n)


def test_default_bounds_are_the_weight_to_eight_times_it() -> None:
    assert default_bounds(2.0) == GovernorBounds(2.0, 16.0, ("batch", "interactive"))
    assert default_bounds(1e38).weight_max == 3e38


def test_the_ladder_goes_from_least_gpu_to_most() -> None:
    assert ladder(BOUNDS) == (("batch", 1), ("interactive", 1), ("interactive", 2), ("interactive", 4),
                              ("interactive", 8))  # fmt: skip
    assert ladder(GovernorBounds(1, 6, ("batch",))) == (("batch", 1), ("batch", 2), ("batch", 4), ("batch", 6))
    assert ladder(GovernorBounds(2, 2, ("interactive",))) == (("interactive", 2),)
    assert ladder(GovernorBounds(0.5, 1.5, ("interactive", "batch"))) == (
        ("batch", 0.5), ("interactive", 0.5), ("interactive", 1.0), ("interactive", 1.5)
    )  # fmt: skip


@pytest.mark.parametrize(
    "klass, weight, rung", [("batch", 1, 0), ("batch", 100, 0), ("interactive", 3, 2), ("interactive", 0.1, 0),
                            ("interactive", 8, 4), ("interactive", 99, 4), ("bogus", 5, 0)]
)  # fmt: skip
def test_a_setting_made_elsewhere_maps_to_the_rung_at_or_below_it(klass: str, weight: float, rung: int) -> None:
    assert rung_of(BOUNDS, klass, weight) == rung


@pytest.mark.parametrize(
    "make",
    [
        lambda: SloTarget(),
        lambda: SloTarget(ttft_p99_ms=0),
        lambda: SloTarget(ttft_p99_ms=math.nan),
        lambda: SloTarget(itl_p99_ms=-5),
        lambda: SloTarget(ttft_p99_ms=True),
        lambda: GovernorBounds(0, 1),
        lambda: GovernorBounds(4, 2),
        lambda: GovernorBounds(1, math.inf),
        lambda: GovernorBounds(1, 2, ()),
        lambda: GovernorBounds(1, 2, ("fast",)),
        lambda: GovernorBounds(1, 2, ("batch", "batch")),
    ],
)
def test_bad_targets_and_bounds_are_refused(make) -> None:
    with pytest.raises(GovernorConfigError):
        make()


def test_a_miss_moves_up_once_the_window_is_after_the_last_change() -> None:
    s = initial_state(BOUNDS, "batch", 1)
    d = step(TARGET, BOUNDS, s, fig(400), 100.0)
    assert d.changed and (d.klass, d.weight) == ("interactive", 1) and d.line and "up to interactive weight 1" in d.line
    d2 = step(TARGET, BOUNDS, d.state, fig(400), 105.0)
    assert not d2.changed and d2.verdict == "settling"
    d3 = step(TARGET, BOUNDS, d2.state, fig(400), 100.0 + GOVERNOR_WINDOW_S)
    assert d3.changed and (d3.klass, d3.weight) == ("interactive", 2)


def test_a_large_miss_climbs_several_rungs() -> None:
    d = step(TARGET, BOUNDS, initial_state(BOUNDS, "batch", 1), fig(1300), 0.0)  # 4.3x: 1 + log2 -> 3 rungs
    assert (d.klass, d.weight) == ("interactive", 4)


def test_any_figure_is_a_decision_never_an_error() -> None:
    tiny = SloTarget(ttft_p99_ms=1e-300)
    d = step(tiny, BOUNDS, initial_state(BOUNDS, "batch", 1), fig(1.7e308), 0.0)  # the ratio overflows to inf
    assert d.changed and d.state.rung == len(ladder(BOUNDS)) - 1
    d = step(TARGET, BOUNDS, GovernorState(rung=99), fig(0.0), 0.0)  # a rung past the ladder: its top
    assert (d.klass, d.weight) == ("interactive", 8)


def test_between_the_margin_and_the_target_nothing_moves() -> None:
    s = initial_state(BOUNDS, "interactive", 4)
    for t in range(0, 600, 5):
        d = step(TARGET, BOUNDS, s, fig(250), float(t))  # met, not with margin (> 0.7 x 300)
        assert not d.changed and d.verdict == "met"
        s = d.state


def test_down_one_rung_after_the_margin_held() -> None:
    s = initial_state(BOUNDS, "interactive", 4)
    t = 0.0
    while True:
        d = step(TARGET, BOUNDS, s, fig(100), t)
        s = d.state
        if d.changed:
            break
        t += 1
    assert t == GOVERNOR_DOWN_AFTER_S and (d.klass, d.weight) == ("interactive", 2)
    assert d.line and d.line.startswith("down to interactive weight 2")


def test_too_few_requests_is_no_judgement() -> None:
    s = initial_state(BOUNDS, "batch", 1)
    d = step(TARGET, BOUNDS, s, fig(5000, n=GOVERNOR_MIN_REQUESTS - 1), 0.0)
    assert not d.changed and d.verdict == "idle" and "too few requests" in d.reason
    d = step(TARGET, BOUNDS, s, fig(None, n=50), 0.0)  # no TTFT sample at all
    assert not d.changed and d.verdict == "idle"


def test_an_itl_target_alone_is_kept() -> None:
    target = SloTarget(itl_p99_ms=50)
    d = step(target, BOUNDS, initial_state(BOUNDS, "batch", 1), fig(5000, itl_ms=60), 0.0)
    assert d.changed and "itl p99 60 ms > 50" in d.reason and "ttft" not in d.reason


def test_an_unreachable_target_is_said_once_and_held() -> None:
    s = initial_state(BOUNDS, "interactive", 8)
    lines, changes = [], 0
    for t in range(0, 300):
        d = step(TARGET, BOUNDS, s, fig(900), float(t))
        s = d.state
        changes += d.changed
        lines += [d.line] if d.line else []
        if t >= GOVERNOR_UNREACHABLE_AFTER_S:
            assert d.verdict == "unreachable" and s.unreachable
    assert changes == 0 and len(lines) == 1 and "unreachable" in lines[0]
    d = step(TARGET, BOUNDS, s, fig(200), 300.0)
    assert d.line and d.line.startswith("target met again") and not d.state.unreachable


def test_a_reversal_sets_a_floor_and_doubles_the_wait() -> None:
    s = GovernorState(rung=3)
    d = step(TARGET, BOUNDS, s, fig(100), 0.0)
    d = step(TARGET, BOUNDS, d.state, fig(100), GOVERNOR_DOWN_AFTER_S)
    assert d.changed and d.state.rung == 2
    d = step(TARGET, BOUNDS, d.state, fig(350), GOVERNOR_DOWN_AFTER_S + GOVERNOR_WINDOW_S)
    assert d.changed and d.state.rung == 3 and d.state.floor == 3
    assert d.state.down_after_s == 2 * GOVERNOR_DOWN_AFTER_S


# -- what its share costs the others (the engine's busy fraction, the other members' weights) -----------------


def used(ttft_ms: float, busy: float, others: float = 2.0) -> Figures:
    """Figures of an engine that used `busy` of the device beside members of `others` weight (two batch engines
    of weight 1: the bench's)."""
    return Figures(ttft_ms, None, 20, busy_frac=busy, others_weight=others)


def test_a_down_that_would_free_no_device_time_is_not_made() -> None:
    """Met with margin at interactive weight 4 while using 5% of the device: the share below (2 / 4) is far more
    than it uses, so a down gives the others nothing and only risks the target: it holds, saying why."""
    s = initial_state(BOUNDS, "interactive", 4)
    for t in range(0, 600, 1):
        d = step(TARGET, BOUNDS, s, used(100, 0.05), float(t))
        assert not d.changed and d.verdict == "margin", (t, d.reason)
        s = d.state
    assert "a lower setting frees nothing (busy 5%, the share below 50%)" in d.reason
    # the bottom of the interactive class: the batch class at the same weight frees nothing either
    d = step(TARGET, BOUNDS, initial_state(BOUNDS, "interactive", 1), used(100, 0.05), 0.0)
    d = step(TARGET, BOUNDS, d.state, used(100, 0.05), GOVERNOR_DOWN_AFTER_S)
    assert not d.changed and "frees nothing" in d.reason


def test_a_down_is_made_when_the_engine_would_use_the_share_below() -> None:
    """Using half the device at interactive weight 4 (share 2/3): the share below, weight 2's (1/2), is one it
    fills: a down gives the others device time, and is made after the margin held."""
    s = initial_state(BOUNDS, "interactive", 4)
    d = step(TARGET, BOUNDS, s, used(100, 0.5), 0.0)
    d = step(TARGET, BOUNDS, d.state, used(100, 0.5), GOVERNOR_DOWN_AFTER_S)
    assert d.changed and (d.klass, d.weight) == ("interactive", 2)
    assert 0.5 >= GOVERNOR_PRESS * share_of(2, 2.0)
    # without the engine's figures of use (an older keeper, a peer that reports none): as before, it moves down
    d = step(TARGET, BOUNDS, s, fig(100), 0.0)
    assert step(TARGET, BOUNDS, d.state, fig(100), GOVERNOR_DOWN_AFTER_S).changed


def test_pressing_on_its_share_moves_up_before_the_target_is_missed() -> None:
    """A flood's onset: the engine uses half the device at interactive weight 1 (share 1/3, its priority budget):
    its p99 is still met, but no longer with margin. It goes up at once to the lowest rung whose share it would
    not press on (weight 4: 0.5 <= 0.8 x 2/3), never past its bounds; met with margin it does not move."""
    s = initial_state(BOUNDS, "interactive", 1)
    d = step(TARGET, BOUNDS, s, used(250, 0.5), 0.0)
    assert d.changed and (d.klass, d.weight) == ("interactive", 4) and d.verdict == "met"
    assert d.line and "pressing on its share (busy 50% of 33%)" in d.line
    d2 = step(TARGET, BOUNDS, d.state, used(250, 0.9), 5.0)  # presses still: not before the window is after it
    assert not d2.changed and d2.verdict == "settling"
    d3 = step(TARGET, BOUNDS, d2.state, used(250, 0.9), GOVERNOR_WINDOW_S)  # 0.9 > 0.8 x 8/10: the top
    assert d3.changed and (d3.klass, d3.weight) == ("interactive", 8)
    d4 = step(TARGET, BOUNDS, d3.state, used(250, 1.0), 100.0)  # at the top and met: held, not "unreachable"
    assert not d4.changed and d4.verdict == "met"
    quiet = step(TARGET, BOUNDS, s, used(100, 0.5), 0.0)  # pressing, but met with margin: the target needs no more
    assert not quiet.changed
    missed = step(TARGET, BOUNDS, s, used(400, 0.5), 0.0)  # a small miss (1 rung) while pressing: to weight 4
    assert missed.changed and (missed.klass, missed.weight) == ("interactive", 4) and missed.verdict == "missed"


# -- sequences ----------------------------------------------------------------------------------------------

TICK = (
    st.floats(0.1, 30.0),  # time to the next tick
    st.one_of(st.none(), st.floats(1.0, 5000.0)),  # ttft p99
    st.integers(0, 40),  # requests
)
TICKS = st.lists(st.tuples(*TICK), min_size=1, max_size=400)


USAGE = st.one_of(st.none(), st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 20.0)))  # (busy, others' weights)
TICKS_USED = st.lists(st.tuples(*TICK, USAGE), min_size=1, max_size=400)


def run(ticks, bounds: GovernorBounds = BOUNDS, start: tuple[str, float] = ("batch", 1)) -> list[tuple[float, int]]:
    """(time, rung) of every change over the ticks ((dt, ttft, requests[, (busy, others' weights) or None]))."""
    s, t, changes = initial_state(bounds, *start), 0.0, []
    for dt, ttft, n, *usage in ticks:
        t += dt
        busy, others = usage[0] if usage and usage[0] is not None else (None, None)
        d = step(TARGET, bounds, s, Figures(ttft, None, n, busy, others), t)
        assert (d.klass, d.weight) == ladder(bounds)[d.state.rung]
        if d.changed:
            changes.append((t, d.state.rung))
            assert d.state.rung != s.rung and d.line
        else:
            assert d.state.rung == s.rung
        s = d.state
    return changes


@given(st.one_of(TICKS, TICKS_USED))
@settings(max_examples=400, deadline=None)
def test_no_figures_make_it_change_more_than_once_per_window(ticks) -> None:
    changes = run(ticks)
    assert all(b[0] - a[0] >= GOVERNOR_WINDOW_S for a, b in zip(changes, changes[1:]))


@given(TICKS)
@settings(max_examples=400, deadline=None)
def test_a_miss_never_moves_down_and_a_margin_never_up(ticks) -> None:
    s, t = initial_state(BOUNDS, "batch", 1), 0.0
    for dt, ttft, n in ticks:
        t += dt
        d = step(TARGET, BOUNDS, s, Figures(ttft, None, n), t)
        if d.changed:
            assert ttft is not None and n >= GOVERNOR_MIN_REQUESTS
            assert (d.state.rung > s.rung) == (ttft > TARGET.ttft_p99_ms)  # type: ignore[operator]
        s = d.state


@given(st.one_of(TICKS, TICKS_USED))
@settings(max_examples=400, deadline=None)
def test_reversals_are_few_whatever_the_figures(ticks) -> None:
    """An up after a down doubles the wait before the next down: within any stretch of GOVERNOR_DOWN_AFTER_MAX_S
    there are at most a handful of them, however the figures swing."""
    changes = run(ticks)
    moves = [(t, b - a) for (t, b), (_t0, a) in zip(changes[1:], changes)]
    reversals = [t for (t, m), (_t, prev) in zip(moves[1:], moves) if m > 0 > prev]
    doublings = math.ceil(math.log2(GOVERNOR_DOWN_AFTER_MAX_S / GOVERNOR_DOWN_AFTER_S))
    for i, t in enumerate(reversals):
        assert sum(1 for u in reversals[i:] if u - t < GOVERNOR_DOWN_AFTER_MAX_S) <= doublings + 2


class Plant:
    """A simulated engine: its p99 at each rung (falling as the rung rises), seen through a window of
    GOVERNOR_WINDOW_S (the worst of the rungs it held in it)."""

    def __init__(self, p99_by_rung: list[float]) -> None:
        self.p99 = p99_by_rung
        self.held: deque[tuple[float, int]] = deque()

    def hold(self, t: float, rung: int) -> None:
        self.held.append((t, rung))
        while len(self.held) > 1 and self.held[1][0] <= t - GOVERNOR_WINDOW_S:
            self.held.popleft()  # the first one left is the rung held at the window's start

    def figures(self, t: float) -> Figures:
        return Figures(max(self.p99[r] for _at, r in self.held), None, 20)


@given(
    st.lists(st.floats(10.0, 3000.0), min_size=5, max_size=5).map(lambda xs: sorted(xs, reverse=True)),
    st.integers(0, 4),
)
@settings(max_examples=100, deadline=None)
def test_a_reachable_target_is_reached_and_kept(p99_by_rung: list[float], start: int) -> None:
    """Whatever the engine's latency at each rung (falling as it rises) and wherever it starts: once some rung
    meets the target, the governor reaches one that does within a minute, and afterwards spends at most one
    window below it per probe down, the probes ever rarer (the wait doubling after each)."""
    need = next((i for i, p in enumerate(p99_by_rung) if p <= TARGET.ttft_p99_ms), None)
    plant = Plant(p99_by_rung)
    s, t = GovernorState(rung=start), 0.0
    plant.hold(t, s.rung)
    below_s, reached_at = 0.0, None
    horizon, tick = 3600.0, 2.0
    while t < horizon:
        t += tick
        d = step(TARGET, BOUNDS, s, plant.figures(t), t)
        s = d.state
        plant.hold(t, s.rung)
        if need is None:
            continue
        if reached_at is None and s.rung >= need:
            reached_at = t
        elif reached_at is not None and s.rung < need:
            below_s += tick
    if need is None:
        assert s.rung == 4 and s.unreachable
        return
    assert reached_at is not None and reached_at <= 6 * GOVERNOR_WINDOW_S
    probes = 1 + math.ceil(math.log2(GOVERNOR_DOWN_AFTER_MAX_S / GOVERNOR_DOWN_AFTER_S)) + horizon / 1800
    assert below_s <= probes * (GOVERNOR_WINDOW_S + tick)


def test_two_engines_whose_targets_cannot_both_hold_say_so_and_hold_still() -> None:
    """Two engines on one GPU, each one's TTFT p99 falling with its share of it: 300 ms for each needs more than
    the whole GPU. Both climb to the top of their bounds, report the target unreachable (one line each), and
    then no weight changes; up to then, a change at most once per 10 s."""
    bounds = GovernorBounds(1, 8)
    rungs = ladder(bounds)

    def p99(mine: tuple[str, float], other: tuple[str, float]) -> float:
        share = mine[1] / (mine[1] + other[1])
        boost = 0.8 if mine[0] == "interactive" and other[0] == "batch" else 1.0
        return 500.0 * boost / share  # 300 ms would need a share above 1 for both

    states = [initial_state(bounds, "batch", 1), initial_state(bounds, "batch", 1)]
    lines: list[list[str]] = [[], []]
    changes: list[list[float]] = [[], []]
    t = 0.0
    while t < 1200:
        t += 1.0
        settings_now = [rungs[s.rung] for s in states]
        for i in (0, 1):
            d = step(TARGET, bounds, states[i], Figures(p99(settings_now[i], settings_now[1 - i]), None, 20), t)
            states[i] = d.state
            if d.changed:
                changes[i].append(t)
            if d.line:
                lines[i].append(d.line)
    for i in (0, 1):
        assert states[i].unreachable and rungs[states[i].rung] == ("interactive", 8)
        assert sum("unreachable" in line for line in lines[i]) == 1
        assert all(b - a >= GOVERNOR_WINDOW_S for a, b in zip(changes[i], changes[i][1:]))
        assert changes[i][-1] < 120  # held still long before the end


# -- who writes -----------------------------------------------------------------------------------------------


def test_a_persons_edit_holds_the_governor_off_until_up_declares_again() -> None:
    assert paused_s(100.0, None, 0.0) == 0.0
    assert paused_s(100.0, 50.0, 0.0) == GOVERNOR_MANUAL_HOLD_S - 50
    assert paused_s(50.0 + GOVERNOR_MANUAL_HOLD_S, 50.0, 0.0) == 0.0
    assert paused_s(100.0, 50.0, 60.0) == 0.0  # `up --reload` after the edit: the file wins
    assert paused_s(100.0, 50.0, 50.0) == 0.0


def test_the_governor_driver_applies_says_and_stands_aside() -> None:
    applied: list[tuple[str, float]] = []
    said: list[str] = []
    now = [0.0]
    gov = Governor(TARGET, BOUNDS, klass="batch", weight=1, figures=lambda t: fig(500), apply=lambda c, w:
                   applied.append((c, w)), say=said.append, now_s=0.0)  # fmt: skip
    d = gov.tick(now[0])
    assert d is not None and applied == [("interactive", 1)] and said[-1].startswith("governor: up to")
    gov.manual(5.0, klass="batch", weight=3)
    assert "paused" in said[-1]
    assert gov.tick(20.0) is None and gov.report(None, 20.0).state == "paused"
    assert gov.report(None, 20.0).paused_s == pytest.approx(GOVERNOR_MANUAL_HOLD_S - 15)
    d = gov.tick(5.0 + GOVERNOR_MANUAL_HOLD_S)  # resumes from the person's setting (batch 3: rung 0)
    assert d is not None and applied[-1] == ("interactive", 1)
    gov.manual(700.0, klass="batch", weight=1)
    gov.declare(701.0, SloTarget(ttft_p99_ms=1000), BOUNDS, klass="interactive", weight=2)
    assert gov.paused_s(702.0) == 0 and gov.state.rung == 2
    r = gov.report(None, 702.0)
    assert (r.ttft_p99_ms, r.weight_min, r.weight_max, r.classes) == (1000, 1, 8, "batch,interactive")


def test_the_report_says_how_much_of_the_last_minute_met_the_target() -> None:
    rec = LatencyRecorder(clock_s=lambda: 0.0)
    for i in range(10):
        r = rec.begin(100.0 + i)
        rec.head(r, 100.0 + i, 200, False)
        rec.chunk(r, 100.0 + i + (0.2 if i < 8 else 0.5), b"{}")
        rec.end(r, 100.5 + i)
    w = rec.window(110.0)
    gov = Governor(TARGET, BOUNDS, klass="batch", weight=1, figures=lambda t: figures_of(rec.window(t, 10)),
                   apply=lambda c, w: None, say=lambda s: None, now_s=100.0)  # fmt: skip
    assert gov.report(w, 110.0).ttft_attained_pct == pytest.approx(80.0)
    f = figures_of(rec.window(110.0, 10))
    assert f.requests == 9 and f.ttft_p99_ms == pytest.approx(500, rel=0.01) and f.itl_p99_ms is None  # 101-110 s
