"""The dashboard's latency: the peers table's TTFT99/ITL99/REQ/S columns (only once an engine reports latency)
and `d`, the selected engine's detail view (its figures, its target, a plot of its latency over time, refreshed
while open). Fixed models (Pilot)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
from slots import model_at

from gpushare_tui.app import DashboardApp
from gpushare_tui.core.observe.latency import LatencyReport
from gpushare_tui.core.pacing.governor import SloReport
from gpushare_tui.dashboard.model import DashboardModel
from gpushare_tui.dashboard.source import FixedSource
from gpushare_tui.widgets.engine_detail import NO_LATENCY, EngineDetail, LatencyPlot
from gpushare_tui.widgets.peers_table import PeersTable

pytestmark = pytest.mark.slow


def with_latency(m: DashboardModel, ttft_p99_ms: float, slo: SloReport | None = None) -> DashboardModel:
    """`m` with its slot-0 engine reporting latency (TTFT p99 `ttft_p99_ms`)."""
    g = m.gpus[0]
    lat = LatencyReport(window_s=60.0, requests=30, req_s=0.5, ttft_p50_ms=ttft_p99_ms / 2, ttft_p99_ms=ttft_p99_ms,
                        itl_p99_ms=25.0, in_flight=1, waiting=0, status_2xx_total=30)  # fmt: skip
    rows = tuple(
        replace(r, engine=replace(r.engine, state="running", latency=lat, slo=slo))
        if r.peer.slot == 0 and r.engine is not None
        else r
        for r in g.rows
    )
    return replace(m, gpus=(replace(g, rows=rows),))


class Stepping(FixedSource):
    """Hands out its models one per collect, then repeats the last; `held`: repeats the first until `release()`
    (a test that checks the first model's screen is not raced by the next collect on a loaded machine)."""

    def __init__(self, models: list[DashboardModel], held: bool = False) -> None:
        super().__init__(models)
        self.i = 0
        self.held = held

    def release(self) -> None:
        self.i, self.held = 1, False

    def prime(self) -> list[DashboardModel]:
        return []

    def collect(self) -> DashboardModel:
        m = self.models[0 if self.held else min(self.i, len(self.models) - 1)]
        self.i += 1
        return m


async def until(pilot, pred, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.02)


def test_latency_columns_appear_once_an_engine_reports_latency() -> None:
    async def main():
        source = Stepping([model_at(0), with_latency(model_at(1), 420.0, SloReport(ttft_p99_ms=300.0))], held=True)
        app = DashboardApp(source, interval_s=0.2)
        async with app.run_test(size=(160, 40)) as pilot:
            table = app.query_one(PeersTable)
            await until(pilot, lambda: app.models_seen >= 1, what="first model")
            assert "ttft" not in table.shown_columns  # nothing to show: no room taken
            source.release()
            await until(pilot, lambda: "ttft" in table.shown_columns, what="latency columns")
            assert {"itl", "reqs"} <= set(table.shown_columns)
            row = next(r for r in table._rows.values() if r.peer.slot == 0)
            assert table.cells(row.key)[list(table.shown_columns).index("ttft")].plain.strip() in ("420!",)

    asyncio.run(main())


def test_d_shows_the_engines_latency_and_follows_it() -> None:
    async def main():
        models = [with_latency(model_at(t), 200.0 + 10 * t, SloReport(ttft_p99_ms=300.0, state="met",
                  ttft_attained_pct=99.0, reason="interactive weight 2: met")) for t in range(20)]  # fmt: skip
        source = Stepping(models)
        app = DashboardApp(source, interval_s=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: source.i >= 20, what="twenty models")
            table = app.query_one(PeersTable)
            await until(pilot, lambda: table.selected_row is not None, what="a selected row")
            table.select_key(next(k for k, r in table._rows.items() if r.peer.slot == 0))
            await pilot.press("d")
            await until(pilot, lambda: isinstance(app.screen, EngineDetail), what="the detail view")
            screen = app.screen
            assert isinstance(screen, EngineDetail)
            text = str(screen.query_one("#detail-latency").render())
            assert "ttft p50 195 p99 390 ms" in text and "0.50 req/s" in text
            assert "ttft p99 ≤ 300 ms (99.0% within, last minute): met" in str(screen.query_one("#detail-slo").render())
            plot = screen.query_one(LatencyPlot)
            assert [s.label for s in plot.series] == ["TTFT p99", "TTFT p50", "ITL p99"] and plot.target_ms == 300
            assert max(plot.series[0].ys) == pytest.approx(390, abs=10)
            source.models.append(with_latency(model_at(30), 900.0))  # the next refresh: a new figure, no target
            figures = screen.query_one("#detail-latency")
            await until(pilot, lambda: "p99 900 ms" in str(figures.render()), what="the next refresh")
            assert plot.target_ms is None and "no latency target" in str(screen.query_one("#detail-slo").render())
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, EngineDetail), what="closed")

    asyncio.run(main())


def test_d_on_an_engine_without_a_front_proxy_says_why_there_is_nothing() -> None:
    async def main():
        app = DashboardApp(FixedSource([model_at(0)]), interval_s=3600)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.models_seen, what="first model")
            await pilot.press("d")
            await until(pilot, lambda: isinstance(app.screen, EngineDetail), what="the detail view")
            assert str(app.screen.query_one("#detail-latency").render()) == NO_LATENCY
            assert app.screen.query_one(LatencyPlot).series == ()

    asyncio.run(main())


def test_an_exit_during_the_start_up_ends_the_app_without_a_traceback() -> None:
    """A SIGINT as the dashboard starts (the demo's handler calls exit()) may take the screen's widgets down
    before on_mount looks them up: the app ends as asked, nothing started, no traceback. (The screen going
    away is played by query_one failing once exit() was called.)"""
    from textual.css.query import NoMatches

    async def main():
        source = FixedSource([model_at(0)])
        app = DashboardApp(source, interval_s=3600)
        real_query_one = app.query_one
        exited: list[bool] = []

        def query_one(*args, **kwargs):
            if exited:
                raise NoMatches("the screen is being taken down")
            return real_query_one(*args, **kwargs)

        def prime():
            app.exit()
            exited.append(True)
            return []

        app.query_one = query_one  # type: ignore[method-assign]
        source.prime = prime  # type: ignore[method-assign]
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.1)
        assert app.collector is None  # nothing started

    asyncio.run(main())
