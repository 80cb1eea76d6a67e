"""The TDM timeline's cursor: computed from the schedule (core.schedule) and the App's clock, drawn as a
strobe (dashboard.strobe) on the timeline's own timer, which redraws nothing else; no timer without a schedule.

Expected positions are computed here from core.schedule (who may run at an instant, the phase
`t mod period`), independently of the widget's code.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

import pytest
from slots import NOW, model_at, slot, snap

from gpushare_tui.app import DashboardApp
from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.registry import segment
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.schedule import v1 as schedule
from gpushare_tui.dashboard.model import DashboardModel
from gpushare_tui.dashboard.source import FixedSource, LiveSource
from gpushare_tui.dashboard.strobe import MIN_FRAME_US, Strobe
from gpushare_tui.widgets.peers_table import PeersTable
from gpushare_tui.widgets.share_plot import SharePlot
from gpushare_tui.widgets.text_line import TextLine
from gpushare_tui.widgets.timeline import Timeline, bar_line, cursor_line

LEGEND_W = len(" strobe 33× slower")  # the right-hand legend's columns (the widest of its two lines)
SIZE = (120, 40)


def expect(slots, t_us: int, bar_w: int) -> tuple[int, int]:
    """(slot that may run at t_us, cursor column) from core.schedule alone."""
    sched = schedule.build_schedule(schedule.member_weights(slots, NOW))
    assert sched is not None
    holders = [s for s in sched.slots if schedule.may_run(sched, s, t_us)]
    assert len(holders) == 1
    return holders[0], (t_us % sched.period_us) * bar_w // sched.period_us


def test_strobe_frames_are_true_samples_one_step_apart():
    st = Strobe(160_000)
    assert (st.step_us, st.periods_per_frame, st.frame_us, st.slowdown) == (10_000, 2, 330_000, 33.0)
    t = NOW + 12_345
    n = st.frame(t)
    assert st.sample_us(n) <= t < st.sample_us(n + 1)
    assert st.until_next_us(t) == st.sample_us(n + 1) - t
    # frame to frame the phase advances one step: the whole period, in order, in 16 frames
    phases = [st.sample_us(n + k) % 160_000 for k in range(17)]
    assert [(b - a) % 160_000 for a, b in zip(phases, phases[1:])] == [10_000] * 16


@pytest.mark.parametrize("period_ms", [80, 81, 120, 155, 160, 235, 236, 250, 400])
def test_strobe_frames_are_at_least_min_frame_apart(period_ms):
    st = Strobe(period_ms * 1000)
    assert MIN_FRAME_US <= st.frame_us < MIN_FRAME_US + st.period_us  # the fewest whole periods per frame
    assert (st.frame_us - st.step_us) % st.period_us == 0
    assert Strobe(80_000).slowdown == 65.0  # four periods and a step per frame


SLOTS = [slot(0, 2, name="chat"), slot(1, 1, name="batch"), slot(2, 1, name="agent"), slot(3, 1, active=0)]


@pytest.mark.parametrize("offset_us", [0, 39_999, 80_000, 95_000, 120_000, 159_999, 1_000_000_007])
def test_cursor_line_at_frozen_clocks_matches_the_schedule(offset_us):
    s = snap(SLOTS)
    assert s.period_ms == 160  # 2:1:1 -> 80, 40, 40 ms
    t = NOW + offset_us
    width = 60 + LEGEND_W
    holder, col = expect(SLOTS, t, 60)
    head = cursor_line(s, width, t).plain
    assert len(head) == width and head.index("▼") == col
    name = {0: "chat", 1: "batch", 2: "agent"}[holder]
    assert f"now: {name} may run" in head
    assert head.endswith(" strobe 33× slower")


def test_bar_shows_the_period_and_windows_at_their_columns():
    s = snap(SLOTS)
    bar = bar_line(s, 60 + LEGEND_W).plain
    assert bar[60:].strip() == "period 160 ms"
    assert bar.startswith(" chat 80ms") and bar.index(" batch") == 30 and bar.index(" agent") == 45
    narrow = bar_line(s, 50).plain  # too narrow for a 40-column bar and the legend: bar only
    assert "period" not in narrow and len(narrow) == 50


async def until(pilot, pred: Callable[[], object], timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.02)


def test_the_widget_reads_the_clock_it_is_given():
    """The cursor's instant is the given clock's current strobe frame (no App attribute looked up)."""
    clock = [NOW + 95_000]
    tl = Timeline(snap(SLOTS), clock=lambda: clock[0])
    st = Strobe(160_000)
    assert tl.cursor_us == st.sample_us(st.frame(clock[0]))
    clock[0] += 10 * st.frame_us
    assert tl.cursor_us == st.sample_us(st.frame(clock[0]))
    assert Timeline(snap([slot(0, 1)]), clock=lambda: 42).cursor_us == 42  # no schedule: the clock's now


def app_at(clock: list[int], share_weights=(2, 1)) -> DashboardApp:
    return DashboardApp(FixedSource([model_at(0, share_weights)]), interval_s=3600, host="h", clock=lambda: clock[0])


@pytest.mark.slow
def test_app_cursor_follows_the_injected_clock_frame_by_frame():
    clock = [NOW]
    slots = [slot(0, 2), slot(1, 1)]  # model_at(0, (2, 1)): 80 + 40 ms windows, a 120 ms period

    async def main():
        app = app_at(clock)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.query(Timeline) and app.query_one(Timeline).frames, what="first frame")
            tl = app.query_one(Timeline)
            st = tl.strobe
            assert st is not None and st.period_us == 120_000
            bar_w = tl.size.width - LEGEND_W
            assert bar_w >= 40
            assert tl.render_line(1).text[bar_w:].strip() == "period 120 ms"
            n0 = st.frame(NOW)
            # frame instants, and instants inside a frame (the frame's own instant is shown)
            for t in (st.sample_us(n0 + 5), st.sample_us(n0 + 13) + 50_000, st.sample_us(n0 + 21), NOW + 10**9):
                clock[0] = t
                shown = st.sample_us(st.frame(t))
                await until(pilot, lambda shown=shown: tl.cursor_us == shown, what=f"frame at {t}")
                holder, col = expect(slots, shown, bar_w)
                head = tl.render_line(0).text
                assert head.index("▼") == col, (t, head)
                assert f"now: p{holder} may run" in head
                assert head.rstrip().endswith("strobe 49× slower")  # 120 ms: three periods + a step per frame

    asyncio.run(main())


@pytest.mark.slow
def test_cursor_ticks_redraw_only_the_timeline(monkeypatch):
    # what each widget actually draws (Textual serves unchanged lines from its cache without calling these)
    drawn: Counter[str] = Counter()
    for cls, method in ((Timeline, "render_line"), (PeersTable, "render_line"), (TextLine, "render_line")):
        monkeypatch.setattr(cls, method, _counting(drawn, cls.__name__, getattr(cls, method)))
    monkeypatch.setattr(SharePlot, "render", _counting(drawn, "SharePlot", SharePlot.render))
    clock = [NOW]

    async def main():
        app = app_at(clock)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.query(Timeline) and app.query_one(Timeline).frames, what="first frame")
            tl = app.query_one(Timeline)
            st = tl.strobe
            assert st is not None
            await until(pilot, lambda: drawn["SharePlot"] and drawn["PeersTable"], what="the first full screen")
            await pilot.pause(0.3)
            before = drawn.copy()
            frames0 = tl.frames
            for k in range(1, 6):
                clock[0] = st.sample_us(st.frame(NOW) + k)
                await until(pilot, lambda k=k: tl.frames == frames0 + k, what=f"frame {k}")
                await pilot.pause()
            grown = drawn - before
            assert grown["Timeline"] >= 5  # the cursor line, once per frame
            assert grown["PeersTable"] == grown["TextLine"] == grown["SharePlot"] == 0, dict(grown)

    asyncio.run(main())


def _counting(counter: Counter[str], name: str, method: Callable) -> Callable:
    def counted(self, *args):
        counter[name] += 1
        return method(self, *args)

    return counted


@pytest.mark.slow
def test_no_timer_work_without_a_schedule():
    clock = [NOW]

    async def main():
        alone, paced = app_at(clock, share_weights=(1,)), app_at(clock)
        for app in (alone, paced):
            async with app.run_test(size=SIZE) as pilot:
                await until(pilot, lambda app=app: app.query(Timeline), what="timeline")
                tl = app.query_one(Timeline)
                if app is alone:
                    await pilot.pause(1.0)  # longer than a paced one takes to tick, even on a loaded box
                    assert tl.strobe is None and tl.ticks == 0 and tl.frames == 0
                    assert "unthrottled" in tl.render_line(1).text
                else:  # with a schedule it does tick (within 0.5 s quiet; a CPU hog can delay the timer)
                    await until(pilot, lambda tl=tl: tl.ticks >= 1 and tl.frames >= 1, what="a tick and its frame")
                    assert tl.strobe is not None and tl.frames == 1  # the clock is frozen: one frame

    asyncio.run(main())


@pytest.mark.slow
def test_a_timeline_scrolled_out_of_view_draws_no_frames_until_it_is_back():
    clock = [NOW]
    views = tuple(g for i in range(4) for g in model_at(0, key=f"gpu-{i}").gpus)
    model = DashboardModel(NOW, views)

    async def main():
        app = DashboardApp(FixedSource([model]), interval_s=3600, host="h", clock=lambda: clock[0])
        async with app.run_test(size=SIZE) as pilot:  # the GPU panels' box (40% of 40 lines) shows 3 of 4
            await until(pilot, lambda: len(app.query(Timeline)) == 4, what="four timelines")
            tls = list(app.query(Timeline))
            await until(pilot, lambda: all(t.frames for t in tls[:3]), what="first frames")
            st = tls[0].strobe
            assert st is not None
            for k in range(1, 4):
                clock[0] = st.sample_us(st.frame(NOW) + k)
                await until(pilot, lambda k=k: all(t.frames == k + 1 for t in tls[:3]), what=f"frame {k}")
            assert tls[3].frames == 0 and tls[3].ticks >= 1  # it looked, and drew nothing
            app.query_one("#gpus").scroll_end(animate=False)
            await until(pilot, lambda: tls[3].frames == 1, what="the last timeline, back in view")
            assert f"now: p{expect([slot(0, 2), slot(1, 1)], tls[3].cursor_us, 1)[0]} may run" in (
                tls[3].render_line(0).text
            )

    asyncio.run(main())


@pytest.mark.slow
def test_live_segment_each_frame_is_the_schedule_at_its_instant(tmp_path, monkeypatch):
    """Real segment, real peers, the real wall clock: frames advance and each shows who may run then."""
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(segment, "SHM_DIR", str(shm))
    members = [Membership("live", w, f"m{i}", pid=930_000 + i, log=lambda _m: None) for i, w in enumerate((2, 1))]
    for m in members:
        m.join()
        m.mark_active()
    sched = schedule.build_schedule(sorted((m.slot, float(m.weight)) for m in members))
    assert sched is not None and sched.period_us == 120_000
    names = {m.slot: f"m{i}" for i, m in enumerate(members)}

    async def main():
        app = DashboardApp(LiveSource(shm_dir=str(shm)), interval_s=0.2)  # the default clock: wall_us
        async with app.run_test(size=SIZE) as pilot:
            shown: set[int] = set()
            deadline = time.monotonic() + 15
            while len(shown) < 4:
                assert time.monotonic() < deadline, f"frames seen: {len(shown)}"
                for m in members:
                    m.mark_active()  # stay members (active drops 2 s after the last step)
                await pilot.pause(0.05)
                tl = next(iter(app.query(Timeline)), None)
                if tl is None or tl.strobe is None or not tl.frames:
                    continue
                t, head = tl.cursor_us, tl.render_line(0).text
                assert abs(t - wall_us()) < 5_000_000  # the wall clock's frames, not a model's time
                holder = next(s for s in sched.slots if schedule.may_run(sched, s, t))
                assert head.index("▼") == (t % sched.period_us) * (tl.size.width - LEGEND_W) // sched.period_us
                assert f"now: {names[holder]} may run" in head
                shown.add(t)

    try:
        asyncio.run(main())
    finally:
        for m in members:
            m.leave()
