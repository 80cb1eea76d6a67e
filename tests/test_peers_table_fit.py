"""The peers table fits the terminal: no horizontal scrollbar at >= 80 columns, the columns that matter
shown (the least useful dropped first), and the `--once` table shows the dashboard's columns."""

from __future__ import annotations

import asyncio

import pytest
from slots import NOW, slot, snap

from gpushare_tui.app import DashboardApp
from gpushare_tui.cli.once import render_table
from gpushare_tui.core.observe.accounting import SOURCE_COUNTER, PeerAccount
from gpushare_tui.core.registry import abi
from gpushare_tui.dashboard.columns import COLUMNS, LATENCY_KEYS
from gpushare_tui.dashboard.model import DashboardModel, EngineInfo, GpuView, PeerRow, achieved_shares
from gpushare_tui.dashboard.report import ReportData
from gpushare_tui.dashboard.source import FixedSource
from gpushare_tui.widgets.peers_table import PeersTable

KEY = "GPU-5f3b9c1e-7a2d-4e8f-9b6c-0d1e2f3a4b5c"
MUST = [c.label for c in COLUMNS if not c.drop]  # SLOT PID NAME WGT SHR% BSY% ACH% STATUS TOK/S SPD% ENGINE


def _model(n: int = abi.SLOT_COUNT) -> DashboardModel:
    """`n` managed peers with long names, tok/s, solo rates, VRAM, busy time and energy: every column has
    something to show."""
    s = snap([slot(i, 1 + i % 3, pid=4_100_000 + i, name=f"engine-with-a-long-name-{i}") for i in range(n)], key=KEY)
    rows = tuple(
        PeerRow(
            KEY,
            p,
            True,
            20_480.0 + p.slot,
            EngineInfo(state="running", tok_s=123.4, solo_tok_s=456.7),
            PeerAccount(SOURCE_COUNTER, 3723.5, 7200.0),
        )
        for p in s.peers
    )
    return DashboardModel(NOW, (GpuView(s, None, rows, achieved_shares(rows)),))


def _header(table: PeersTable) -> list[str]:
    return table.render_line(0).text.replace("▲", " ").replace("▼", " ").split()


@pytest.mark.slow
@pytest.mark.parametrize(("size", "rows"), [((80, 24), 16), ((80, 24), 2), ((100, 30), 16), ((120, 40), 16)])
def test_no_horizontal_scrollbar_and_the_key_columns_shown(size: tuple[int, int], rows: int) -> None:
    async def main() -> None:
        app = DashboardApp(FixedSource([_model(rows)]), interval_s=3600)
        async with app.run_test(size=size) as pilot:
            table = app.query_one(PeersTable)
            for _ in range(50):
                if table.row_count == rows:
                    break
                await pilot.pause(0.02)
            await pilot.pause()
            assert table.row_count == rows
            assert not table.show_horizontal_scrollbar and table.max_scroll_x == 0
            assert table.virtual_size.width <= table.scrollable_content_region.width
            header = _header(table)
            assert [h for h in header if h in MUST] == MUST, header  # every column that matters, in order
            assert header == [c.label for c in COLUMNS if c.key in table.shown_columns]
            if size[0] >= 120:  # wide enough for every column but ENERGY (no energy source here) and CLS (and
                # the latency columns: no engine here reports its clients' latency)
                assert {c.key for c in COLUMNS} - set(table.shown_columns) <= {"energy", "class"} | LATENCY_KEYS
            line = table.render_line(1).text  # a row's cells are not cut short: SPD% and ENGINE are there
            assert " 27 running" in line, line

    asyncio.run(main())


def test_once_table_has_the_dashboard_tables_headers_and_cells() -> None:
    model = _model(3)
    text = render_table(ReportData("host", NOW, [(None, g) for g in model.gpus]))
    lines = text.splitlines()

    async def main() -> list[str]:
        app = DashboardApp(FixedSource([model]), interval_s=3600)
        async with app.run_test(size=(160, 40)) as pilot:
            table = app.query_one(PeersTable)
            while table.row_count < 3:
                await pilot.pause(0.02)
            return _header(table)

    # every column (the table is not width-limited) but the latency ones: as the dashboard, none reports latency
    assert lines[1].split() == [c.label for c in COLUMNS if c.key not in LATENCY_KEYS]
    assert asyncio.run(main()) == lines[1].split()
    first = lines[2].split()
    assert first[:5] == ["0", "4100000", "engine-with-a-long-name-0", "-", "1"]  # USER: - (not verifiable here)
    assert first[-9:] == ["123.4", "27", "running", "1:02:03", "2.00", "<1s", "20.0G", KEY, "v1"]
