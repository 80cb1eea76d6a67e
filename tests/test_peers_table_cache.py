"""The peers table's row-strip cache stays bounded: a row that leaves (an engine restarted: same slot, new
pid) takes its cached strips with it, and the cache is an LRU besides (as Textual's own Log and DataTable)."""

from __future__ import annotations

import asyncio

from slots import NOW, slot, snap

from gpushare_tui.app import DashboardApp
from gpushare_tui.dashboard.model import DashboardModel, GpuView, PeerRow, achieved_shares
from gpushare_tui.dashboard.source import FixedSource
from gpushare_tui.widgets.peers_table import STRIP_CACHE_SIZE, PeersTable

RESTARTS = 200


def _view(restarts: int) -> GpuView:
    """Two peers; slot 0's engine has restarted `restarts` times (a new pid each time)."""
    s = snap([slot(0, 2, pid=5_000_000 + restarts, name="restarting"), slot(1, 1, pid=4_999_999, name="steady")])
    rows = tuple(PeerRow("k", p, True) for p in s.peers)
    return GpuView(s, None, rows, achieved_shares(rows))


def _rows(restarts: int) -> tuple[PeerRow, ...]:
    return _view(restarts).rows


def test_strip_cache_stays_bounded_as_rows_come_and_go() -> None:
    async def main() -> None:
        app = DashboardApp(FixedSource([DashboardModel(NOW, (_view(0),))]), interval_s=3600)
        async with app.run_test(size=(120, 30)) as pilot:
            table = app.query_one(PeersTable)
            while table.row_count < 2:  # the App's first refresh has shown its model
                await pilot.pause(0.02)
            for n in range(1, RESTARTS + 1):
                table.show(_rows(n))
                lines = [table.render_line(y).text for y in (1, 2)]  # both rows drawn: their strips cached
                assert any(f"{5_000_000 + n}" in line for line in lines), lines
            await pilot.pause()
            assert table.row_count == 2
            assert 2 <= len(table._strips) <= 2 * 3  # per live row at most: plain, cursor, blurred cursor
            assert table._strips.maxsize == STRIP_CACHE_SIZE

    asyncio.run(main())
