"""The dashboard's screen layout and plots (fixed models, no processes): `p` at 80×24,
coinciding lines, one-unit time axes, NO_COLOR legends, titles that fit, one toast at a
time, and the weight dialog's live share preview."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
from slots import model_at
from textual.geometry import Region
from textual.widgets._toast import Toast

from gpushare_tui.app import HISTORY_SPANS_S, DashboardApp
from gpushare_tui.core.observe.gpu import DeviceStats
from gpushare_tui.dashboard.history import Series
from gpushare_tui.dashboard.model import DashboardModel
from gpushare_tui.dashboard.source import FixedSource
from gpushare_tui.widgets.gpu_panel import info_line
from gpushare_tui.widgets.palette import slot_rgb
from gpushare_tui.widgets.peers_table import PeersTable
from gpushare_tui.widgets.plot_overlap import interleave
from gpushare_tui.widgets.plot_ticks import time_ticks
from gpushare_tui.widgets.share_plot import SharePlot
from gpushare_tui.widgets.timeline import Timeline
from gpushare_tui.widgets.weight_modal import WeightModal, share_preview

BRAILLE = range(0x2801, 0x2900)  # a braille cell with at least one dot


@pytest.fixture(autouse=True)
def _colour(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("NO_COLOR", raising=False)


def history(n: int = 90, share_weights=(2, 1)) -> list:
    """n seconds of one GPU whose managed peers have these weights (busy 50 % each)."""
    return [model_at(t, share_weights, tok=(None,) * len(share_weights)) for t in range(n)]


async def until(pilot, pred, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.02)
    return value


def plot_lines(plot: SharePlot) -> list:
    return plot.render_lines(Region(0, 0, *plot.outer_size))


def plot_text(plot: SharePlot) -> list[str]:
    return [s.text for s in plot_lines(plot)]


def canvas_text(plot: SharePlot) -> str:
    """What is drawn inside the axes (between the frame's top and the x axis, right of the y axis)."""
    lines = plot_text(plot)
    top = next(i for i, t in enumerate(lines) if "┌" in t)
    bottom = next(i for i, t in enumerate(lines) if "└" in t)
    return "\n".join(t[t.index("┤") + 1 :] if "┤" in t else t[t.index("│", 1) + 1 :] for t in lines[top + 1 : bottom])


def braille_colours(plot: SharePlot) -> set[tuple[int, int, int]]:
    out = set()
    for strip in plot_lines(plot):
        for seg in strip:
            if seg.style and seg.style.color and any(ord(c) in BRAILLE for c in seg.text):
                out.add(tuple(seg.style.color.get_truecolor()))
    return out


def plots(app: DashboardApp) -> list[SharePlot]:
    return list(app.query(SharePlot))


async def loaded(pilot, app: DashboardApp) -> None:
    """The first model shown and the screen laid out for it (on a loaded host a fixed pause is not enough for the
    layout: a widget's region is empty until it is)."""
    await until(pilot, lambda: app.models_seen, what="first model")
    await pilot.pause(0.1)
    await until(pilot, lambda: app.query_one(Timeline).region.height and app.query_one(PeersTable).region.height,
                what="the screen laid out")  # fmt: skip


# -- p at 80×24 ----------------------------------------------------------


@pytest.mark.slow
def test_p_at_80x24_toggles_the_plots_only_and_everything_fits():
    async def main():
        app = DashboardApp(FixedSource(history(share_weights=(2, 1, 1))), interval_s=3600)
        async with app.run_test(size=(80, 24)) as pilot:
            await loaded(pilot, app)
            box = app.query_one("#plots")
            timeline, table = app.query_one(Timeline), app.query_one(PeersTable)
            screen = Region(0, 1, 80, 22)  # between the top bar and the footer
            assert not box.display, "plots hidden by default below PLOTS_MIN_HEIGHT lines"
            assert timeline.region.height == 2 and screen.contains_region(timeline.region)
            for shown in (True, False, True):
                await pilot.press("p")
                await until(pilot, lambda s=shown: box.display == s, 2, what=f"plots shown={shown}")
                await pilot.pause(0.1)
                assert timeline.region.height == 2 and screen.contains_region(timeline.region), "timeline kept"
                assert table.region.height >= 2 + 1 + 3, "the table's border, header and its 3 rows"
                assert screen.contains_region(table.region)
                assert not table.region.overlaps(timeline.region)
                if shown:
                    assert screen.contains_region(box.region) and box.region.height >= 10
                    assert not box.region.overlaps(table.region)
                    assert box.region.y >= table.region.bottom

    asyncio.run(main())


# -- plots ----------------------------------------------------------------


def test_two_peers_at_the_same_share_are_both_visible():
    async def main():
        app = DashboardApp(FixedSource(history(share_weights=(1, 1))), interval_s=3600)
        async with app.run_test(size=(120, 40)) as pilot:
            await loaded(pilot, app)
            share = app.query_one("#plot-share", SharePlot)
            assert {s.ys for s in share._series} == {(50.0, 50.0)}, "two lines at 50 %"
            await until(pilot, lambda: braille_colours(share) == {slot_rgb(0), slot_rgb(1)}, 2, what="both colours")

    asyncio.run(main())


def test_coinciding_lines_take_turns_and_others_are_kept():
    a = Series(0, "a", (-100.0, -50.0, 0.0), (25.0, 25.0, 25.0))
    b = Series(1, "b", (-100.0, 0.0), (25.0, 25.0))
    c = Series(2, "c", (-100.0, 0.0), (50.0, 50.0))
    strokes = interleave((a, b, c), 120.0, 20, 10)
    by_slot = {s: [k for k in strokes if k.slot == s] for s in (0, 1, 2)}
    assert [(k.xs, k.ys, k.joined) for k in by_slot[2]] == [(c.xs, c.ys, True)], "c meets nobody: kept as it is"
    xs_a = {x for k in by_slot[0] for x in k.xs}
    xs_b = {x for k in by_slot[1] for x in k.xs}
    assert xs_a and xs_b and not xs_a & xs_b, "a and b share the columns, each its own"
    assert all(-100 <= x <= 0 for x in xs_a | xs_b)
    cell = 120.0 / 20
    cols_a, cols_b = {int((x + 120) // cell) for x in xs_a}, {int((x + 120) // cell) for x in xs_b}
    assert cols_a.isdisjoint(cols_b) and len(cols_a | cols_b) >= 16  # alternating cells over ~100 s
    assert all(y == 25.0 for k in by_slot[0] + by_slot[1] for y in k.ys)


@pytest.mark.parametrize("span_s", HISTORY_SPANS_S)
@pytest.mark.parametrize("cols", [18, 34, 60, 120])
def test_time_ticks_are_round_values_in_one_unit(span_s, cols):
    ticks = time_ticks(span_s, cols)
    labels = [label for _, label in ticks]
    assert labels[-1] == "now" and ticks[-1][0] == 0 and len(ticks) >= 2
    units = {label[-1] for label in labels[:-1]}
    assert units == ({"s"} if span_s <= 120 else {"m"}), labels
    scale = 1 if units == {"s"} else 60
    for x, label in ticks[:-1]:
        assert float(label[:-1]) * scale == x and -span_s <= x < 0, (x, label)
    step = ticks[-1][0] - ticks[-2][0]
    assert all(abs((b[0] - a[0]) - step) < 1e-9 for a, b in zip(ticks, ticks[1:])), "evenly spaced"
    assert cols * step / span_s >= max(map(len, labels)) + 1, "labels fit between ticks"


@pytest.mark.slow
def test_every_span_labels_its_axis_in_one_unit_on_screen():
    async def main():
        app = DashboardApp(FixedSource(history()), interval_s=3600)
        async with app.run_test(size=(100, 30)) as pilot:
            await loaded(pilot, app)
            for _ in HISTORY_SPANS_S:
                await pilot.press("h")
                await pilot.pause(0.1)
                for plot in plots(app):
                    axis = next(t for t in plot_text(plot) if "now" in t).split()
                    axis = [w.strip("│") for w in axis if w.strip("│") not in ("", "now")]
                    assert axis and len({w[-1] for w in axis}) == 1, (app.history_s, axis)
                    assert {w[-1] for w in axis} == ({"s"} if app.history_s <= 120 else {"m"})

    asyncio.run(main())


@pytest.mark.parametrize("no_color", [False, True])
def test_the_achieved_legend_matches_the_markers(no_color, monkeypatch):
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")

    async def main():
        app = DashboardApp(FixedSource(history(share_weights=(2, 1))), interval_s=3600)
        async with app.run_test(size=(120, 40)) as pilot:
            await loaded(pilot, app)
            assert app.no_color == no_color
            plot = app.query_one("#plot-achieved", SharePlot)
            await until(pilot, lambda: plot._series, 2, what="achieved lines")
            canvas, legend = canvas_text(plot), plot.legend
            braille = any(ord(c) in BRAILLE for c in canvas)
            if no_color:
                assert "digits: achieved" in legend and "⣿" not in legend
                assert not braille and "0" in canvas and "1" in canvas, canvas
            else:
                assert "⣿ achieved" in legend and braille
                assert not any(c in canvas for c in "0123456789"), canvas
            assert "-- configured" in legend and "-" in canvas

    asyncio.run(main())


@pytest.mark.parametrize("no_color", [False, True])
@pytest.mark.parametrize("size", [(80, 24), (100, 30), (120, 40)])
def test_plot_titles_and_legends_are_never_cut(size, no_color, monkeypatch):
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")

    async def main():
        app = DashboardApp(FixedSource(history(share_weights=(2, 1))), interval_s=3600)
        async with app.run_test(size=size) as pilot:
            await loaded(pilot, app)
            if not app.query_one("#plots").display:
                await pilot.press("p")
                await pilot.pause(0.1)
            for plot in plots(app):
                await until(pilot, lambda p=plot: p._series, 2, what="lines")
                text = plot_text(plot)
                assert plot.border_title and str(plot.border_title) in text[0], text[0]
                if plot.id == "plot-achieved":
                    assert "ach" in plot.legend and "--" in plot.legend, plot.legend  # both kinds of line
                    assert str(plot.legend) in text[-1], text[-1]
                assert "…" not in text[0] + text[-1]

    asyncio.run(main())


# -- toasts ---------------------------------------------------------------


@pytest.mark.slow
def test_only_one_toast_at_a_time():
    async def main():
        app = DashboardApp(FixedSource(history()), interval_s=3600)
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            await loaded(pilot, app)
            for key in ("o", "o", "h", "h", "o"):
                await pilot.press(key)
                await pilot.pause(0.05)
            await pilot.pause(0.2)
            assert [n.message for n in app._notifications] == [f"sorted by {app._table.sort_column}"]
            assert len(app.screen.query(Toast)) == 1

    asyncio.run(main())


# -- weight dialog -------------------------------------------------------


@pytest.mark.slow
def test_the_weight_dialog_previews_the_share_as_you_type():
    async def main():
        app = DashboardApp(FixedSource(history(share_weights=(2, 1, 1))), interval_s=3600)
        async with app.run_test(size=(120, 40)) as pilot:
            await loaded(pilot, app)
            await pilot.press("w")  # slot 0, weight 2 of 2 + 1 + 1
            modal = await until(pilot, lambda: isinstance(app.screen, WeightModal) and app.screen, what="dialog")
            preview = modal.query_one("#weight-preview")

            def said() -> str:
                return str(preview.render())

            await until(pilot, lambda: "share 50.0%" in said(), 2, what="the current share")
            await pilot.press("backspace", "6")  # 6 / (6 + 2)
            await until(pilot, lambda: "share 75.0%" in said(), 2, what="the share of weight 6")
            assert not preview.has_class("-invalid")
            await pilot.press("x")
            await until(pilot, lambda: "must be a number > 0" in said(), 2, what="why 6x is invalid")
            assert preview.has_class("-invalid")
            await pilot.press("backspace", "backspace", "0", ".", "5")  # 0.5 / 2.5
            await until(pilot, lambda: "share 20.0%" in said(), 2, what="the share of weight 0.5")

    asyncio.run(main())


# -- GPU panels -----------------------------------------------------------


@pytest.mark.slow
def test_two_gpus_at_80x24_fit_without_a_scrollbar():
    a, b = model_at(0, key="gpu-a"), model_at(0, key="gpu-b")
    both = DashboardModel(a.now_us, a.gpus + b.gpus)

    async def main():
        app = DashboardApp(FixedSource([both]), interval_s=3600)
        async with app.run_test(size=(80, 24)) as pilot:
            await loaded(pilot, app)
            gpus = app.query_one("#gpus")
            for shown in (False, True):
                assert app.query_one("#plots").display == shown
                assert app.has_class("-tight"), "short and two GPUs: tight panels"
                assert gpus.max_scroll_y == 0 and not gpus.show_vertical_scrollbar
                assert [t.region.height for t in app.query(Timeline)] == [2, 2]
                await pilot.press("p")
                await pilot.pause(0.1)
        app = DashboardApp(FixedSource([a]), interval_s=3600)
        async with app.run_test(size=(80, 24)) as pilot:
            await loaded(pilot, app)
            assert not app.has_class("-tight"), "one GPU, no plots: the full panel fits"

    asyncio.run(main())


def test_the_gpu_info_line_leaves_readings_out_rather_than_cut():
    dev = DeviceStats(name="L40S", util_pct=93.0, mem_used_mib=39770.0, mem_total_mib=46068.0, temperature_c=67.0)
    view = replace(model_at(0).gpus[0], device=replace(dev, power_w=284.0))
    full = info_line(view).plain
    assert full.endswith("67°C · 284 W") and len(full) > 76
    fitted = info_line(view, 76).plain
    assert len(fitted) <= 76 and fitted.endswith("· 67°C") and fitted in full
    assert info_line(view, 20).plain.startswith("period ") and "util 93%" in info_line(view, 20).plain
    writable = replace(view, snapshot=replace(view.snapshot, mode=0o666))
    assert info_line(writable, 40).plain.startswith("⚠ world-writable · period")


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_empty_plots_and_gpu_notes_fit(size):
    uuid = "GPU-3f9c2a4e-7d1b-4c55-9e0a-5b2f8c1d6e77"
    a, b = model_at(0, key=uuid, busy=(0.0, 0.0)), model_at(0, key="cpu-lab", busy=(0.0, 0.0))

    async def main():
        app = DashboardApp(FixedSource([DashboardModel(a.now_us, a.gpus + b.gpus)]), interval_s=3600)
        async with app.run_test(size=size) as pilot:
            await loaded(pilot, app)
            if not app.query_one("#plots").display:
                await pilot.press("p")
                await pilot.pause(0.1)
            assert app.selected_gpu == uuid
            share, achieved = app.query_one("#plot-share", SharePlot), app.query_one("#plot-achieved", SharePlot)
            said = "no busy time reported yet" if size[0] >= 100 else "no busy time yet"
            assert any(said in t for t in plot_text(achieved)), "nobody busy: no achieved share, and it says so"
            assert share.border_subtitle == (uuid if size[0] >= 140 else "GPU-3f9c2a4e…")
            assert "GPU-3f9c2a4e…" in plot_text(share)[-1]

    asyncio.run(main())


def test_share_preview_says_the_share_or_why_not():
    assert share_preview("2", [2.0], True) == ("→ share 50.0%  (others' weights: 2)", True)
    assert share_preview(" 3 ", [], True) == ("→ share 100.0%  (no other member)", True)
    assert share_preview("1", [1.0, 2.0], False) == ("→ share 25.0% once active  (others' weights: 3)", True)
    # the window the engine gets, with the 10 % floor: not w ÷ Σw
    assert share_preview("0.001", [1.0], True) == (
        "→ share 10.0% (w ÷ Σw 0.1%, lifted by the floor)  (others' weights: 1)", True
    )  # fmt: skip
    assert share_preview("100", [1.0], True) == (
        "→ share 90.0% (w ÷ Σw 99.0%, less the others' floor)  (others' weights: 1)", True
    )  # fmt: skip
    for bad in ("", "0", "-1", "nan", "inf", "1e40", "two"):
        said, ok = share_preview(bad, [1.0], True)
        assert not ok and "must be a number > 0" in said, bad
