"""The peers table's row-strip cache stays bounded: a row that leaves (an engine restarted: same slot, new
pid) takes its cached strips with it, and the cache is an LRU besides (as Textual's own Log and DataTable)."""

from __future__ import annotations

import asyncio
import dataclasses

from slots import NOW, slot, snap

from gpushare_tui.app import DashboardApp
from gpushare_tui.dashboard.model import DashboardModel, EngineInfo, GpuView, PeerRow, achieved_shares
from gpushare_tui.dashboard.source import FixedSource
from gpushare_tui.widgets.peers_table import STRIP_CACHE_SIZE, PeersTable, display_key, row_cells

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


def _managed(user: str | None, kind: str, activity: str) -> tuple[PeerRow, ...]:
    s = snap([slot(0, 2, pid=4_999_998, name="chat")])
    p = dataclasses.replace(s.peers[0], user=user)
    return (PeerRow("k", p, True, None, EngineInfo(state="running", kind=kind, activity=activity)),)


def test_a_row_repaints_when_only_its_user_or_its_kind_changes() -> None:
    """The row's cached text is keyed by what it shows: a change in USER alone, or in the engine's kind or
    activity source alone (the ENGINE cell), repaints it."""

    async def main() -> None:
        first = GpuView(snap([]), None, _managed("alice", "llama-server", "llama"))
        app = DashboardApp(FixedSource([DashboardModel(NOW, (first,))]), interval_s=3600)
        async with app.run_test(size=(160, 30)) as pilot:
            table = app.query_one(PeersTable)
            while table.row_count < 1:
                await pilot.pause(0.02)
            table.show(_managed("alice", "llama-server", "llama"))
            line = table.render_line(1).text
            assert "alice" in line and "llama" in line, line
            table.show(_managed("bob", "llama-server", "llama"))
            line = table.render_line(1).text
            assert "bob" in line and "alice" not in line, line
            table.show(_managed("bob", "command", "cpu"))
            line = table.render_line(1).text
            assert "cmd·cpu" in line, line

    asyncio.run(main())


def test_equal_display_keys_render_equal_cells() -> None:
    """display_key covers every column: rows that differ in any one column's text have different keys."""
    base = _managed("alice", "llama-server", "llama")[0]
    variants = [
        base,
        _managed("bob", "llama-server", "llama")[0],
        _managed("alice", "vllm", "metrics")[0],
        _managed("alice", "llama-server", "always")[0],
        _managed(None, "llama-server", "llama")[0],
    ]
    for a in variants:
        for b in variants:
            if display_key(a) == display_key(b):
                assert [c.plain for c in row_cells(a)] == [c.plain for c in row_cells(b)]
            else:
                assert a is not b
