"""The dashboard's words a newcomer reads: the GPU line says its schedule in plain words (no `ext1 users`), the CLS
cell's short forms are explained under the table while CLS is shown, and a timeline window too narrow for its
label never runs it into the next window's."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from slots import NOW, slot, snap

from gpushare_tui.app import DashboardApp
from gpushare_tui.core.registry import abi
from gpushare_tui.dashboard.columns import CLASS_LEGEND, schedule_note
from gpushare_tui.dashboard.model import DashboardModel, GpuView, PeerRow, achieved_shares
from gpushare_tui.dashboard.source import FixedSource
from gpushare_tui.widgets.gpu_panel import info_line
from gpushare_tui.widgets.peers_table import PeersTable
from gpushare_tui.widgets.timeline import bar_line, window_label

EXT1, DEMAND = abi.FLAG_EXT1, abi.FLAG_DEMAND


def _view(slots: list[abi.SlotRecord], users_applied: bool = False, uids: tuple[int, ...] = ()) -> GpuView:
    s = snap(slots)
    peers = tuple(replace(p, uid=uid, user=f"user{uid}") for p, uid in zip(s.peers, uids)) + s.peers[len(uids) :]
    s = replace(s, peers=peers, users_applied=users_applied)
    rows = tuple(PeerRow("k", p) for p in s.peers)
    return GpuView(s, None, rows, achieved_shares(rows))


def test_the_gpu_line_says_its_schedule_in_words() -> None:
    members = [replace(slot(0, 1), flags=EXT1 | DEMAND), replace(slot(1, 1), flags=EXT1)]
    assert schedule_note(_view(members).snapshot) == "interactive first"
    one_user = _view(members, users_applied=True, uids=(1000, 1000))
    assert schedule_note(one_user.snapshot) == "interactive first"  # one user: nothing to split between users
    users = _view(members, users_applied=True, uids=(1000, 1001))
    assert schedule_note(users.snapshot) == "interactive first, fair between users"
    line = info_line(users).plain
    assert "interactive first, fair between users" in line and "ext1" not in line, line


def test_a_narrow_window_label_never_runs_into_the_next() -> None:
    assert window_label("agent", 300, 20) == " agent 300ms"
    assert window_label("agent", 300, 12) == " agent"  # " agent 300ms" would fill it: no blank before the next
    assert window_label("agent", 300, 6) == " age…"  # and its blank
    assert window_label("agent", 300, 3) == ""
    # 80x24: the bar gets 60 cells; at 6:1:1 agent's and batch's windows are 7 cells: each label keeps a blank
    s = snap([slot(0, 6, name="chat"), slot(1, 1, name="agent"), slot(2, 1, name="batch")])
    bar = bar_line(s, 78).plain
    assert " agent  batch  " in bar, bar  # not " agent batch": two windows, not one label
    s = snap([slot(0, 12, name="chat"), slot(1, 1, name="agent"), slot(2, 1, name="batch")])
    assert " age…  bat…  " in bar_line(s, 78).plain


def test_the_class_cells_are_explained_under_the_table_while_shown() -> None:
    v = _view([replace(slot(0, 2, name="chat"), flags=EXT1 | DEMAND), slot(1, 1, name="batch")])

    async def main(width: int) -> tuple[str, bool]:
        app = DashboardApp(FixedSource([DashboardModel(NOW, (v,))]), interval_s=3600)
        async with app.run_test(size=(width, 30)) as pilot:
            table = app.query_one(PeersTable)
            while table.row_count < 2:
                await pilot.pause(0.02)
            await pilot.pause()
            return str(table.border_subtitle or ""), "class" in table.shown_columns

    assert asyncio.run(main(180)) == (CLASS_LEGEND, True)
    subtitle, shown = asyncio.run(main(80))
    assert subtitle == ("" if not shown else CLASS_LEGEND)
    assert "+ has work in flight" in CLASS_LEGEND and "bat batch" in CLASS_LEGEND
