"""The dashboard's log pane (`L`) against real engines: a synthetic engine writing to a log file,
one whose output is a pipe (no log) and a foreign peer (no control socket)."""

from __future__ import annotations

import asyncio
import os

import pytest
from test_app_pilot import _row_ready, notes, start_synth, until
from textual.widgets import Log

from gpushare_tui.app import DashboardApp
from gpushare_tui.core.pacing.control import socket_path
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.widgets.log_pane import FIRST_LINES, LogPane
from gpushare_tui.widgets.peers_table import PeersTable
from testkit.cli import cli_argv
from testkit.wait import wait_for

pytestmark = pytest.mark.slow


def start_logging_synth(procs, key: str, log: str):
    with open(log, "ab") as out:
        argv = ["synth", "--weight", "1", "--name", "logged", "--gpu-key", key, "--quiet", "--busy-idle", "0.1:0.9"]
        p = procs.start(cli_argv(*argv, "--step-ms", "1"), stdout=out, stderr=out)
    wait_for(lambda: p.poll() is not None or os.path.exists(socket_path(p.pid)), 20, what="synth control socket")
    assert p.poll() is None
    wait_for(lambda: "joined" in open(log).read(), 10, what="join line in the log")
    return p


def append(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def test_L_shows_the_log_of_a_managed_engine_and_follows_it_at_80x24(gpu_key, procs, runtime_dir, tmp_path):
    log = str(tmp_path / "engine.log")
    p = start_logging_synth(procs, gpu_key, log)
    append(log, "".join(f"line {i}\n" for i in range(300)))

    async def main():
        app = DashboardApp(gpu_key=gpu_key, interval_s=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            await _row_ready(pilot, p.pid)
            await pilot.press("L")
            pane = await until(pilot, lambda: isinstance(app.screen, LogPane) and app.screen, what="log pane")
            lines = pane.query_one(Log)
            await until(pilot, lambda: lines.line_count, what="lines shown")
            await until(pilot, lambda: lines.region.height, what="the pane laid out")  # a frame later when loaded
            assert list(lines.lines) == [f"line {i}" for i in range(300 - FIRST_LINES, 300)]
            # it fits: the whole pane, its title, path and hint are on the 80x24 screen
            for part in (pane.query_one("Vertical"), pane.query_one(".title"), pane.query_one("#log-hint"), lines):
                r = part.region
                assert r.x >= 0 and r.y >= 0 and r.right <= 80 and r.bottom <= 24 and r.height >= 1, (part, r)
            assert lines.region.height >= 12
            assert str(pane.query_one("#log-path").render()) == log
            assert "(pid" in str(pane.query_one(".title").render()) and str(p.pid) in str(
                pane.query_one(".title").render()
            )
            # following: appended lines show up, made printable
            append(log, "fresh \x1b[2J line\n")
            await until(pilot, lambda: lines.lines[-1] == "fresh \ufffd[2J line", 5, what="the appended line")
            assert lines.lines[-2] == "line 299"
            for key in ("L", "escape", "q"):
                if key != "L":
                    await pilot.press("L")
                    await until(pilot, lambda: isinstance(app.screen, LogPane), what="log pane again")
                await pilot.press(key)
                await until(pilot, lambda: not isinstance(app.screen, LogPane), what=f"{key} closes the pane")
            assert app.is_running  # q closed the pane, not the app

    asyncio.run(main())


def test_L_without_a_log_to_show_is_a_toast(gpu_key, procs, runtime_dir):
    foreign = Membership(gpu_key, 1.0, "foreign", pid=os.getpid(), log=lambda _m: None)  # no control socket
    foreign.join()
    try:
        p = start_synth(procs, gpu_key)  # its output is a pipe: no log file

        async def main():
            app = DashboardApp(gpu_key=gpu_key, interval_s=0.2)
            async with app.run_test(size=(120, 40)) as pilot:
                table = app.query_one(PeersTable)
                await until(pilot, lambda: table.row_count == 2, what="two rows")
                await until(pilot, lambda: table.selected_row is not None, what="a selected row")
                if table.selected_row.peer.pid != os.getpid():
                    await pilot.press("down")
                assert table.selected_row.peer.pid == os.getpid() and not table.selected_row.managed
                await pilot.press("L")
                await until(pilot, lambda: notes(app), what="toast")
                assert notes(app) == [f"foreign (pid {os.getpid()}) is a foreign peer: no log to show"]
                await pilot.press("up" if table.cursor_row else "down")
                await _row_ready(pilot, p.pid)
                await pilot.press("L")
                no_log = f"engine {p.pid} reports no log file (its output goes to a terminal or a pipe)"
                await until(pilot, lambda: notes(app) == [no_log], what="second toast (replacing the first)")
                await pilot.pause(0.3)
                assert not isinstance(app.screen, LogPane)

        asyncio.run(main())
    finally:
        foreign.leave()
