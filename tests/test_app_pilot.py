"""Dashboard Pilot tests against real engines (`gpushare-tui synth`) and real segments.

Each test uses its own gpu key and control-socket directory; every process it
starts is killed by pid (SIGCONT, then SIGKILL) and its segment removed (the
conftest fixtures do both).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import psutil
import pytest
from slots import NOW, model_at, slot, snap
from textual.geometry import Region
from textual.widgets import Button, Input, Select, Static

from gpushare_tui.app import ADMIN_ACTIONS, DashboardApp
from gpushare_tui.core.engines.kinds import FORM_KINDS as KINDS
from gpushare_tui.core.engines.kinds import KIND_BY_KEY
from gpushare_tui.core.engines.launcher import LaunchReply, LaunchSpec
from gpushare_tui.core.host.errors import EngineError
from gpushare_tui.core.pacing import control
from gpushare_tui.core.pacing.control import socket_path
from gpushare_tui.core.registry import abi, segment
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.registry.segment import Segment
from gpushare_tui.dashboard.control import LocalControl
from gpushare_tui.dashboard.model import DashboardModel, EngineInfo, GpuView, PeerRow
from gpushare_tui.dashboard.source import FixedSource, LiveSource
from gpushare_tui.demo import start_demo, stop_demo
from gpushare_tui.widgets.confirm_stop import ConfirmStop
from gpushare_tui.widgets.gpu_panel import GpuPanel, info_line
from gpushare_tui.widgets.help_screen import NAVIGATION, HelpScreen
from gpushare_tui.widgets.launch_form import FIELDS, SLO, LaunchForm, launch_in_worker
from gpushare_tui.widgets.peers_table import PeersTable, cell_text
from gpushare_tui.widgets.share_plot import SharePlot
from gpushare_tui.widgets.timeline import Timeline
from gpushare_tui.widgets.weight_modal import WeightModal
from testkit.cli import cli_argv
from testkit.shm import shm_file, unique_key
from testkit.wait import wait_for

pytestmark = pytest.mark.slow

SIZE = (120, 40)


def start_synth(procs, key: str, weight: str = "1", name: str = "pilot"):
    p = procs.start(
        cli_argv(
            "synth",
            "--weight",
            weight,
            "--name",
            name,
            "--gpu-key",
            key,
            "--quiet",
            "--busy-idle",
            "0.2:0.8",
            "--step-ms",
            "2",
        )
    )
    wait_for(lambda: p.poll() is not None or os.path.exists(socket_path(p.pid)), 20, what="synth control socket")
    assert p.poll() is None, p.stderr.read() if p.stderr else "synth exited"
    wait_for(lambda: slot_of(key, p.pid) is not None, 10, what="synth slot")
    return p


def slot_of(key: str, pid: int) -> abi.SlotRecord | None:
    try:
        with Segment.attach_readonly(shm_file(key)) as seg:
            return next((r for r in seg.read_slots() if r.pid == pid), None)
    except Exception:
        return None


async def until(pilot, pred: Callable[[], object], timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.02)


async def open_form(pilot) -> LaunchForm:
    """`l`, then the launch form once it has mounted (its fields shown for its first kind)."""
    await pilot.press("l")
    app = pilot.app
    return await until(
        pilot, lambda: isinstance(app.screen, LaunchForm) and app.screen.is_mounted and app.screen, what="the form"
    )


async def press_launch(pilot, form: LaunchForm) -> None:
    """Press the form's Launch button and wait until the form has checked its fields (each check shows a
    new `errors` dict). Button.press(), not pilot.click: a click's point is taken from the last layout, and
    a kind switch or an error line lays the form out again by messages still on their way, so a click
    could land beside the button (the vLLM kind's error then never came)."""
    checked = form.errors
    form.query_one("#launch", Button).press()
    await until(pilot, lambda: form.errors is not checked, what="the form to check its fields")


def notes(app: DashboardApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def _row_ready(pilot, pid: int):
    app = pilot.app
    table = app.query_one(PeersTable)
    await until(
        pilot,
        lambda: (
            table.selected_row is not None
            and table.selected_row.peer.pid == pid
            and table.selected_row.engine is not None
        ),
        what=f"row of pid {pid} with engine status",
    )
    return table


def test_keyboard_weight_edit_reaches_the_slot_within_1s(gpu_key, procs, runtime_dir):
    p = start_synth(procs, gpu_key)

    async def main():
        app = DashboardApp(gpu_key=gpu_key, interval_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await _row_ready(pilot, p.pid)
            await pilot.press("w")
            await until(pilot, lambda: isinstance(app.screen, WeightModal), what="weight modal")
            await pilot.press("backspace", "backspace", "3", ".", "5")
            await pilot.press("enter")
            t0 = time.monotonic()
            while True:
                rec = slot_of(gpu_key, p.pid)
                if rec is not None and rec.weight == 3.5:
                    break
                assert time.monotonic() - t0 <= 1.0, f"slot weight still {rec and rec.weight} after 1 s"
                await asyncio.sleep(0.01)
            assert not isinstance(app.screen, WeightModal)
            # and the table shows it at a following refresh
            table = app.query_one(PeersTable)
            await until(pilot, lambda: table.selected_row.peer.weight == 3.5, what="table weight 3.5")

    asyncio.run(main())


INVALID_WEIGHTS = ["-1", "0", "abc", "nan", "inf", "1e39", ""]


def test_invalid_weight_is_rejected_inline_and_nothing_is_sent(gpu_key, procs, runtime_dir):
    p = start_synth(procs, gpu_key, weight="2")
    sent: list = []

    class Spy(LocalControl):
        def request(self, pid, cmd, timeout_s=3.0, **kw):
            if cmd != "status":
                sent.append((pid, cmd, kw))
            return super().request(pid, cmd, timeout_s, **kw)

    async def main():
        app = DashboardApp(gpu_key=gpu_key, interval_s=0.2, control=Spy())
        async with app.run_test(size=SIZE) as pilot:
            await _row_ready(pilot, p.pid)
            for text in INVALID_WEIGHTS:
                await pilot.press("w")
                modal = await until(pilot, lambda: isinstance(app.screen, WeightModal) and app.screen, what="modal")
                await pilot.press("backspace", "backspace", *list(text), "enter")
                await pilot.pause(0.1)
                assert app.screen is modal, f"{text!r}: the modal must stay open"
                error = str(modal.query_one("#weight-preview").render())
                assert "must be a number > 0" in error or "enter a weight" in error, (text, error)
                await pilot.press("escape")
                await until(pilot, lambda: not isinstance(app.screen, WeightModal), what="modal closed")
        assert sent == []
        assert slot_of(gpu_key, p.pid).weight == 2.0

    asyncio.run(main())


def test_nudge_and_stop_a_managed_engine(gpu_key, procs, runtime_dir):
    p = start_synth(procs, gpu_key, weight="2")

    async def main():
        app = DashboardApp(gpu_key=gpu_key, interval_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await _row_ready(pilot, p.pid)
            await pilot.press("plus")
            await until(pilot, lambda: slot_of(gpu_key, p.pid).weight == 3.0, 2, what="weight 3 after +")
            await until(pilot, lambda: app.query_one(PeersTable).selected_row.peer.weight == 3.0, what="row at 3")
            await pilot.press("minus", "minus")
            await until(pilot, lambda: slot_of(gpu_key, p.pid).weight == 1.0, 3, what="weight 1 after - -")
            await pilot.press("s")
            await until(pilot, lambda: isinstance(app.screen, ConfirmStop), what="confirmation")
            await pilot.press("n")  # no: nothing happens
            await pilot.pause(0.3)
            assert p.poll() is None
            await pilot.press("s")
            await until(pilot, lambda: isinstance(app.screen, ConfirmStop), what="confirmation")
            await pilot.press("y")
            await until(pilot, lambda: p.poll() is not None, 10, what="engine exit after stop")
            await until(pilot, lambda: app.query_one(PeersTable).row_count == 0, what="row gone")

    asyncio.run(main())


def test_foreign_peer_is_read_only(gpu_key, procs, runtime_dir):
    foreign = Membership(gpu_key, 1.0, "foreign", pid=os.getpid())  # no control socket
    foreign.join()
    try:

        async def main():
            app = DashboardApp(gpu_key=gpu_key, interval_s=0.2)
            async with app.run_test(size=SIZE) as pilot:
                table = app.query_one(PeersTable)
                await until(pilot, lambda: table.selected_row is not None, what="row")
                assert not table.selected_row.managed
                assert cell_text(table.selected_row, "engine") == "read-only"
                for key in ("w", "plus", "s"):
                    await pilot.press(key)
                    await pilot.pause(0.1)
                    assert not isinstance(app.screen, (WeightModal, ConfirmStop))
                assert any("foreign peer" in n and "read-only" in n for n in notes(app)), notes(app)
                assert all(len(n.splitlines()) == 1 for n in notes(app))
            assert slot_of(gpu_key, os.getpid()).weight == 1.0

        asyncio.run(main())
    finally:
        foreign.leave()


def test_readonly_disables_every_admin_action(gpu_key, procs, runtime_dir):
    p = start_synth(procs, gpu_key, weight="2")

    async def main():
        app = DashboardApp(gpu_key=gpu_key, interval_s=0.2, readonly=True)
        async with app.run_test(size=SIZE) as pilot:
            await _row_ready(pilot, p.pid)
            for key in ("w", "plus", "minus", "l", "s"):
                app.clear_notifications()
                await pilot.press(key)
                await pilot.pause(0.1)
                assert app.screen is app.screen_stack[0], f"{key} opened {app.screen}"
                assert ["read-only" in n for n in notes(app)] == [True], key
            footer_keys = {b.binding.key for b in app.active_bindings.values() if b.binding.show and b.enabled}
            assert not footer_keys & {"w", "l", "s"}
        assert slot_of(gpu_key, p.pid).weight == 2.0
        assert p.poll() is None

    asyncio.run(main())


def test_launch_form_validation(gpu_key, tmp_path, monkeypatch):
    monkeypatch.setattr("gpushare_tui.widgets.launch_form.default_binary", lambda: "no-such-llama-server-here")
    calls: list[LaunchSpec] = []

    def runner(spec: LaunchSpec) -> LaunchReply:
        calls.append(spec)
        return LaunchReply(4242, 8081, "127.0.0.1", "/tmp/x.log", 0, 4241, "/tmp/s.log")

    engine = tmp_path / "llama-server"
    engine.write_text("#!/bin/sh\nexit 0\n")
    engine.chmod(engine.stat().st_mode | stat.S_IXUSR)
    not_exec = tmp_path / "not-exec"
    not_exec.write_text("")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")

    async def main():
        app = DashboardApp(gpu_key=gpu_key, interval_s=0.2, launch_runner=runner)
        async with app.run_test(size=SIZE) as pilot:
            form = await open_form(pilot)
            assert form.values()["gpu_key"] == gpu_key

            async def submit(**values):
                for k, v in values.items():
                    form.query_one(f"#f-{k}").value = v
                form.query_one("#f-weight").focus()
                checked = form.errors
                await pilot.press("enter")  # Enter in any field submits, like the Launch button
                await until(pilot, lambda: form.errors is not checked, what="the form to check its fields")

            await press_launch(pilot, form)
            assert set(form.errors) == {"binary", "model"}  # llama-server not on PATH here; no model yet
            await submit(binary="", model="", weight="0", port="70000", gpu_key="bad key!", extra="-c 'x")
            assert set(form.errors) == {"binary", "model", "weight", "port", "gpu_key", "extra"}
            assert "must be a number > 0" in form.errors["weight"]
            assert "nothing was started" in form.status_text

            await submit(
                binary=str(tmp_path / "nope"),
                model=str(tmp_path / "missing.gguf"),
                weight="nan",
                port="abc",
                gpu_key=gpu_key,
                extra="",
            )
            assert "no such file" in form.errors["binary"] and "no such file" in form.errors["model"]
            assert set(form.errors) == {"binary", "model", "weight", "port"}

            await submit(binary=str(not_exec), model=str(model), weight="2", port="", extra="-m other.gguf")
            assert "not executable" in form.errors["binary"]
            assert "Model path field" in form.errors["extra"]
            assert calls == []

            await submit(
                binary=str(engine), model=str(model), weight="2", port="8081", name="big", extra="-c 4096 --threads 2"
            )
            assert form.errors == {}
            await until(pilot, lambda: not isinstance(app.screen, LaunchForm), what="form closes on success")
            assert len(calls) == 1
            spec = calls[0]
            assert (spec.weight, spec.gpu_key, spec.name) == (2.0, gpu_key, "big")
            assert spec.engine_argv == (str(engine), "-m", str(model), "--port", "8081", "-c", "4096", "--threads", "2")
            assert any("engine pid 4242" in n for n in notes(app))

    asyncio.run(main())


def test_launch_form_shows_the_engines_error(gpu_key, tmp_path):
    def runner(spec: LaunchSpec) -> LaunchReply:
        raise EngineError("engine exited during load (code 1)", "loading\nerror: bad model\n")

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")

    async def main():
        app = DashboardApp(gpu_key=gpu_key, interval_s=0.2, launch_runner=runner)
        async with app.run_test(size=SIZE) as pilot:
            form = await open_form(pilot)
            form.query_one("#f-binary").value = "/bin/true"
            form.query_one("#f-model").value = str(model)
            await press_launch(pilot, form)
            await until(pilot, lambda: "bad model" in form.status_text, what="error shown in the form")
            assert app.screen is form
            assert "engine exited during load" in form.status_text

    asyncio.run(main())


def test_launch_really_launches_and_reports_the_engines_error(gpu_key, tmp_path, runtime_dir):
    """The default runner really launches (in a worker thread); an engine that cannot be started
    fails with one line, shown in the form."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    broken = tmp_path / "broken-engine"
    broken.write_text("#!/nonexistent/interpreter\n")  # passes the form's checks, then cannot be executed
    broken.chmod(0o755)

    async def main():
        app = DashboardApp(gpu_key=gpu_key, interval_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            form = await open_form(pilot)
            form.query_one("#f-binary").value = str(broken)
            form.query_one("#f-model").value = str(model)
            await press_launch(pilot, form)
            await until(pilot, lambda: form.errors == {} and form.last_spec is not None, what="the launch to start")
            await until(pilot, lambda: not form.running, timeout=60, what="the launch to fail")
            assert app.screen is form
            assert f"cannot start {broken}" in form.status_text and "no such" in form.status_text.lower()
            assert len(form.status_text.splitlines()) == 1, form.status_text

    asyncio.run(main())


def help_rows_shown(screen: HelpScreen) -> list[tuple[str, str]]:
    """(keys, what) of each row of the help table, read from what it draws (wrapped lines joined)."""
    keys = screen.query_one("#help-keys")
    rows: list[list[str]] = []
    for strip in keys.render_lines(Region(0, 0, keys.size.width, keys.size.height)):
        line = strip.text.rstrip()
        if not line:
            rows.append(["", ""])  # the gap between navigation and the bound keys
        elif line.startswith(" "):
            rows[-1][1] += " " + line.strip()  # a wrapped description
        else:
            key, _, what = line.partition("  ")
            rows.append([key, what.strip()])
    return [(k, w) for k, w in rows]


@pytest.mark.parametrize("readonly", [False, True], ids=["admin", "readonly"])
def test_help_overlay_lists_every_bound_key(gpu_key, readonly):
    async def main():
        app = DashboardApp(gpu_key=gpu_key, interval_s=0.2, readonly=readonly)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("question_mark")
            help_screen = await until(pilot, lambda: isinstance(app.screen, HelpScreen) and app.screen, what="help")
            await pilot.pause()
            rows = help_rows_shown(help_screen)
            assert rows[: len(NAVIGATION)] == list(NAVIGATION) and rows[len(NAVIGATION)] == ("", "")
            shown = {k: what for keys, what in rows[len(NAVIGATION) + 1 :] for k in keys.split(" / ")}
            bound = [b for b in app.BINDINGS if b.action != "readonly_refused"]  # w,+,-,l,s again, refused
            assert sorted(shown) == sorted(app.get_key_display(b) for b in bound)
            for b in bound:
                what = shown[app.get_key_display(b)]
                admin = b.action.partition("(")[0] in ADMIN_ACTIONS
                assert what == (f"{b.tooltip} (disabled: --readonly)" if admin and readonly else b.tooltip), b
            assert shown["q"] == shown["Ctrl+C"] == "quit" and shown["+"] == shown["-"]
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, HelpScreen), what="help closed")
            await pilot.press("question_mark")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="help again")
            await pilot.press("question_mark")
            await until(pilot, lambda: not isinstance(app.screen, HelpScreen), what="? toggles")

    asyncio.run(main())


class ClosingSource(FixedSource):
    """Fixed models; records which thread collects and when the source is closed."""

    def __init__(self) -> None:
        super().__init__([model_at(0)])
        self.threads: set[threading.Thread] = set()
        self.collects_after_close = 0
        self.closed = threading.Event()

    def collect(self):
        self.threads.add(threading.current_thread())
        self.collects_after_close += self.closed.is_set()
        return super().collect()

    def close(self) -> None:
        self.closed.set()


@pytest.mark.timeout(30)  # a collector that does not end holds up asyncio.run's exit (the executor)
@pytest.mark.parametrize("key", ["q", "ctrl+c"])
def test_quit_ends_the_collector_promptly(key):
    source = ClosingSource()

    async def main():
        app = DashboardApp(source, interval_s=3600)  # the collector sleeps: quitting must wake it
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.models_seen, what="first model")
            await pilot.press(key)
            await until(pilot, lambda: source.closed.is_set(), 2, what="the collector to close the source")
            assert not app.is_running
        assert app.collector.is_cancelled
        assert source.threads and threading.main_thread() not in source.threads  # collected off the UI thread
        assert source.collects_after_close == 0

    t0 = time.monotonic()
    asyncio.run(main())  # returns only once the collector's thread has ended
    assert time.monotonic() - t0 < 10


def test_segments_appear_disappear_and_a_corrupt_one_is_an_error_row(tmp_path, monkeypatch):
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(segment, "SHM_DIR", str(shm))  # our Memberships create their segments here
    members: list[Membership] = []

    async def main():
        app = DashboardApp(LiveSource(shm_dir=str(shm)), interval_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.model is not None, what="first model")
            assert app.query_one("#empty").display
            for key, name in (("gpu-a", "a0"), ("gpu-b", "b0"), ("gpu-a", "a1")):
                m = Membership(key, 1.0, name, pid=900_000 + len(members), log=lambda _m: None)
                m.join()
                members.append(m)
            await until(
                pilot,
                lambda: len(app.query(GpuPanel)) == 2 and app.query_one(PeersTable).row_count == 3,
                what="two panels, three rows",
            )
            assert not app.query_one("#empty").display
            (shm / "opencoti-gpu-junk").write_bytes(b"\x00" * 4096)
            (shm / "opencoti-gpu-short").write_bytes(b"OCGPU")
            await until(pilot, lambda: app.model is not None and len(app.model.errors) == 2, what="error rows")
            errors = str(app.query_one("#errors").render())
            assert "/opencoti-gpu-junk" in errors and "bad magic" in errors
            assert "/opencoti-gpu-short" in errors and "wrong size" in errors
            assert len(app.query(GpuPanel)) == 2  # the good ones are still shown
            members[1].leave()
            os.unlink(shm / "opencoti-gpu-gpu-b")
            (shm / "opencoti-gpu-junk").unlink()
            await until(pilot, lambda: [p.gpu_key for p in app.query(GpuPanel)] == ["gpu-a"], what="gpu-b gone")
            await until(pilot, lambda: app.query_one(PeersTable).row_count == 2, what="two rows")
            assert app.is_running

    try:
        asyncio.run(main())
    finally:
        for m in members:
            m.leave()


def test_selection_survives_refresh_and_sorting(tmp_path, monkeypatch):
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(segment, "SHM_DIR", str(shm))
    members = [Membership("sel", w, f"p{i}", pid=910_000 + i, log=lambda _m: None) for i, w in enumerate((1, 5, 3))]
    for m in members:
        m.join()
        m.mark_active()

    async def main():
        app = DashboardApp(LiveSource(shm_dir=str(shm)), interval_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(PeersTable)
            await until(pilot, lambda: table.row_count == 3, what="rows")
            await pilot.press("down")
            assert table.selected_row.peer.name == "p1"
            await pilot.pause(0.6)  # a few refreshes
            assert table.selected_row.peer.name == "p1"
            table.sort_by("weight", reverse=True)
            await pilot.pause()
            assert [table.row(k).peer.name for k in table.order] == ["p1", "p2", "p0"]
            assert table.selected_row.peer.name == "p1" and table.cursor_row == 0
            await pilot.press("down")
            assert table.selected_row.peer.name == "p2"
            # mouse: a click on the header sorts, a click on a row selects
            await pilot.click(PeersTable, offset=(20, 1))  # NAME header (inside the border)
            await pilot.pause()
            assert table.sort_column == "name"
            await pilot.click(PeersTable, offset=(20, 2))  # first row
            await pilot.pause()
            assert table.selected_row.peer.name == "p0"

    try:
        asyncio.run(main())
    finally:
        for m in members:
            m.leave()


def plot_text(plot: SharePlot) -> str:
    return "\n".join(s.text for s in plot.render_lines(Region(0, 0, *plot.outer_size)))


def test_span_key_cycles_every_plots_time_axis():
    async def main():
        models = [model_at(t, tok=(30.0, 10.0)) for t in range(60)]  # tok/s: the achieved plot has data too
        app = DashboardApp(FixedSource(models), interval_s=3600)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.models_seen, what="first model")
            plots = list(app.query(SharePlot))
            assert len(plots) == 3 and {p.span_s for p in plots} == {120.0}
            for span, label in ((300.0, "-5m"), (600.0, "-10m"), (60.0, "-60s"), (120.0, "-120s")):
                await pilot.press("h")
                assert app.history_s == span and {p.span_s for p in plots} == {span}
                await until(pilot, lambda s=label: all(s in plot_text(p) for p in plots), 2, what=f"{label} axis")
                assert f"last {span / 60:g} min" in notes(app)[-1]

    asyncio.run(main())


def test_plots_follow_the_terminal_height_unless_toggled():
    async def main():
        app = DashboardApp(FixedSource([model_at(0)]), interval_s=3600)
        async with app.run_test(size=(120, 24)) as pilot:
            plots = app.query_one("#plots")
            await until(pilot, lambda: app.models_seen, what="first model")
            assert not plots.display and app.has_class("-noplots")  # short: the table first
            await pilot.resize_terminal(120, 40)
            await until(pilot, lambda: plots.display, what="plots shown when tall enough")
            assert not app.has_class("-noplots") and not app.has_class("-compact")
            await pilot.resize_terminal(120, 24)
            await until(pilot, lambda: not plots.display, what="plots hidden when short again")
            await pilot.press("p")  # shown on request, the GPU panels make room (compact, timeline kept)
            await until(pilot, lambda: plots.display, what="plots shown by p")
            # (shown is said before the screen is laid out anew: on a loaded host the regions come a frame later)
            await until(pilot, lambda: app.query_one(Timeline).region.height == 2, 2, what="the timeline kept")
            assert app.has_class("-compact")
            await pilot.resize_terminal(120, 40)
            await pilot.pause(0.1)
            assert plots.display and not app.has_class("-compact")
            await pilot.press("p")  # hidden on request, however tall
            await until(pilot, lambda: not plots.display, what="plots hidden by p")
            await pilot.resize_terminal(120, 45)
            await pilot.pause(0.1)
            assert not plots.display

    asyncio.run(main())


class SettableSource(FixedSource):
    """Collects whatever model the test set last."""

    def __init__(self, model) -> None:
        super().__init__([model])
        self.model = model

    def collect(self):
        return self.model


def test_the_selected_gpus_panel_is_marked_when_there_are_several():
    a, b = model_at(0, key="gpu-a"), model_at(0, key="gpu-b")
    source = SettableSource(a)

    async def main():
        app = DashboardApp(source, interval_s=3600)
        async with app.run_test(size=SIZE) as pilot:

            def marked() -> dict[str, bool]:
                return {p.gpu_key: p.has_class("-selected") for p in app.query(GpuPanel)}

            await until(pilot, lambda: marked() == {"gpu-a": False}, what="one panel, not marked")
            source.model = DashboardModel(a.now_us, a.gpus + b.gpus)  # a second GPU appears
            app.refresh_now()
            await until(pilot, lambda: marked() == {"gpu-a": True, "gpu-b": False}, what="gpu-a marked")
            await pilot.press("end")  # a row of gpu-b
            await until(pilot, lambda: marked() == {"gpu-a": False, "gpu-b": True}, what="gpu-b marked")
            assert app.selected_gpu == "gpu-b"
            source.model = b  # gpu-a goes: one panel again
            app.refresh_now()
            await until(pilot, lambda: marked() == {"gpu-b": False}, what="one panel, not marked")

    asyncio.run(main())


def _two_segments(live_key: str = "live", idle_key: str = "idle") -> DashboardModel:
    """`live_key` with a live peer; `idle_key` whose only peer died long ago (its segment stays)."""
    live = snap([slot(0, 1)], key=live_key)
    idle = snap([slot(0, 1, age_s=600)], key=idle_key)
    views = tuple(GpuView(s, None, tuple(PeerRow(s.gpu_key, p) for p in s.peers)) for s in (live, idle))
    return DashboardModel(NOW, views)


def test_segments_without_live_peers_are_hidden_until_e():
    async def main():
        app = DashboardApp(FixedSource([_two_segments()]), interval_s=3600)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.models_seen, what="first model")
            assert [g.gpu_key for g in app.model.gpus] == ["live"] and set(app._panels) == {"live"}
            assert [r.gpu_key for r in app._table._rows.values()] == ["live"]
            await pilot.press("e")
            await until(pilot, lambda: set(app._panels) == {"live", "idle"}, 2, what="the idle segment shown")
            assert {r.gpu_key for r in app._table._rows.values()} == {"live", "idle"}
            await pilot.press("e")
            await until(pilot, lambda: set(app._panels) == {"live"}, 2, what="the idle segment hidden again")

    asyncio.run(main())


def test_only_idle_segments_say_so():
    async def main():
        idle_only = replace(_two_segments(), gpus=_two_segments().gpus[1:])
        app = DashboardApp(FixedSource([idle_only]), interval_s=3600)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.models_seen, what="first model")
            empty = app.query_one("#empty")
            assert not empty.has_class("-hidden")
            assert "1 segment with no live peers hidden: `e` shows them." in str(empty.render())
        shown = DashboardApp(FixedSource([idle_only]), interval_s=3600, gpu_key="idle")  # named: always shown
        async with shown.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: shown.models_seen, what="first model")
            assert set(shown._panels) == {"idle"}

    asyncio.run(main())


def _dead_and_live(key: str = "k") -> DashboardModel:
    """One live managed engine, one dead managed one (its socket gone), one dead foreign peer; the dead
    ones last busy 48 %."""
    s = snap([slot(0, 1, busy=0.3), slot(1, 1, age_s=700, busy=0.48, pid=999_991), slot(2, 1, age_s=30, busy=0.48)],
             key=key)  # fmt: skip
    rows = (
        PeerRow(key, s.peers[0], True, None, EngineInfo("running", 50.0, 60.0)),
        PeerRow(key, s.peers[1], True),
        PeerRow(key, s.peers[2], False),
    )
    return DashboardModel(NOW, (GpuView(s, None, rows),))


def test_dead_rows_show_no_stale_numbers_and_admin_keys_on_them_say_why():
    """A dead row's BSY% is `-`, the top bar counts live peers as the GPU panel does ("1 peer"), and
    w / + / - / s / L on a dead row notify why nothing happens instead of opening a dialog."""

    class Control(LocalControl):
        def request(self, *a, **kw):  # nothing may be sent for a dead row
            raise AssertionError(f"control request {a} for a dead row")

    async def main():
        app = DashboardApp(FixedSource([_dead_and_live()]), interval_s=3600, control=Control())
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.models_seen, what="first model")
            table = app.query_one(PeersTable)
            await until(pilot, lambda: table.row_count == 3, what="three rows")
            by_slot = {r.peer.slot: r for r in (table.row(k) for k in table.order) if r is not None}
            assert [cell_text(by_slot[i], "busy") for i in (0, 1, 2)] == ["30", "-", "-"]
            top = app.query_one("#top").text.plain
            assert "1 GPU segment · 1 peer " in top + " ", top  # not "3 peers": two are dead slots
            panel = app.query_one(GpuPanel)
            assert "· 1 peer, 1 active" in info_line(panel._view).plain, "the panel counts the same"
            for slot_no in (1, 2):  # managed and foreign, both dead
                table.select_key(by_slot[slot_no].key)
                await pilot.pause()
                for key in ("w", "plus", "minus", "s", "L"):
                    app.clear_notifications()
                    await pilot.press(key)
                    said = await until(pilot, lambda: notes(app), 2, what=f"a notification for {key}")
                    assert "is dead (no heartbeat for" in said[-1] and "cannot" in said[-1], said
                    assert type(app.screen).__name__ == "Screen", f"{key} opened {app.screen}"
            table.select_key(by_slot[0].key)  # the live one: the weight editor opens as before
            await pilot.pause()
            await pilot.press("w")
            await until(pilot, lambda: isinstance(app.screen, WeightModal), 2, what="weight modal")

    asyncio.run(main())


def test_an_unanswering_engine_says_why_instead_of_a_dialog():
    s = snap([slot(0, 1)])
    row = PeerRow("k", s.peers[0], True, None, EngineInfo(error="timed out after 0.3 s"))

    async def main():
        app = DashboardApp(FixedSource([DashboardModel(NOW, (GpuView(s, None, (row,)),))]), interval_s=3600)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.query_one(PeersTable).selected_row is not None, what="a row")
            for key in ("w", "s"):
                app.clear_notifications()
                await pilot.press(key)
                said = await until(pilot, lambda: notes(app), 2, what=f"a notification for {key}")
                assert "did not answer its control socket" in said[-1] and "timed out" in said[-1], said
                assert type(app.screen).__name__ == "Screen"

    asyncio.run(main())


def test_sort_arrow_sits_beside_the_sorted_columns_label():
    async def main():
        app = DashboardApp(FixedSource([model_at(0, share_weights=(100, 1))]), interval_s=3600)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(PeersTable)
            await until(pilot, lambda: table.row_count == 2, what="rows")
            await pilot.press("o")  # slot → share, high to low
            await until(pilot, lambda: table.sort_column == "share", 2, what="sorted by share")
            await pilot.pause()
            header = table.render_line(0).text
            assert "▼SHR%" in header and "WGT▼" not in header and "WGT " in header, header
            row = table.selected_row
            assert row is not None and cell_text(row, "share") == "90.0"  # the window, not w ÷ Σw 99.0
            assert [cell_text(table.row(k), "share") for k in table.order] == ["90.0", "10.0*"]

    asyncio.run(main())


def test_help_defines_every_column_and_the_strobe():
    from gpushare_tui.dashboard.columns import COLUMNS

    async def main():
        app = DashboardApp(FixedSource([model_at(0)]), interval_s=3600)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("question_mark")
            screen = await until(pilot, lambda: isinstance(app.screen, HelpScreen) and app.screen, what="help")
            await pilot.pause()
            columns = screen.query_one("#help-columns")
            lines = [
                s.text.rstrip() for s in columns.render_lines(Region(0, 0, columns.size.width, columns.size.height))
            ]
            labels = {line.split("  ")[0] for line in lines if line and not line.startswith(" ")}
            assert labels == {c.label for c in COLUMNS}
            text = " ".join(" ".join(lines).split())  # wrapped lines joined
            assert "10%" in text and "sum past 100" in text and "activity window" in text
            assert "strobe N× slower" in str(screen.query_one("#help-screen-text").render())


# -- the launch form's engine kinds; the hints -------------------------------------------------------------


def _end_launched(started: list[int]) -> None:
    """End what the form launched: the supervisor (started[0]) first, which ends its engine in order; then the
    engine itself, if left."""
    if started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(started[0], signal.SIGTERM)
        with contextlib.suppress(psutil.NoSuchProcess, psutil.TimeoutExpired):
            psutil.Process(started[0]).wait(15)
    for pid in started:
        _end(pid)


def _end(pid: int) -> None:
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break


async def _launched_row(pilot, name: str):
    table = pilot.app.query_one(PeersTable)
    return await until(
        pilot,
        lambda: next((r for r in table._rows.values() if r.peer.name == name and r.managed), None),
        timeout=30,
        what=f"the launched engine {name!r} joined and shown",
    )


def test_launch_form_starts_a_real_synthetic_engine_that_joins(gpu_key, tmp_path, runtime_dir, monkeypatch):
    """The kind selector shows the synthetic engine's fields (checked by core/engines/declaration), and the
    default runner starts a real `gpushare-tui synth` that joins and is shown as managed."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    started: list[int] = []

    async def main():
        app = DashboardApp(gpu_key=gpu_key, interval_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            form = await open_form(pilot)
            assert form.kind == "llama-server" and form.query_one("#r-binary").display
            assert not form.query_one("#r-step_ms").display
            form.query_one("#f-kind", Select).value = "synth"  # switched at once: the fields are its own
            assert not form.query_one("#r-binary").display
            assert form.query_one("#r-step_ms").display and form.query_one("#r-work_units").display
            assert set(form.values()) == {"kind", "step_ms", "work_units", "weight", "class", "name", "gpu_key"}
            assert form.values()["class"] == "batch"  # the default, as `synth`
            for k, v in {"step_ms": "0", "work_units": "x", "weight": "-1", "name": ""}.items():
                form.query_one(f"#f-{k}").value = v
            await press_launch(pilot, form)
            assert set(form.errors) == {"step_ms", "work_units", "weight"}, form.errors
            assert "must be between 0.05 and 10000" in form.errors["step_ms"]
            assert "must be an integer >= 0" in form.errors["work_units"]
            assert "nothing was started" in form.status_text
            for k, v in {"step_ms": "2", "work_units": "0", "weight": "3", "name": "from-form"}.items():
                form.query_one(f"#f-{k}").value = v
            form.query_one("#f-class", Select).value = "interactive"
            await press_launch(pilot, form)
            await until(pilot, lambda: not isinstance(app.screen, LaunchForm), timeout=60, what="launched")
            assert form.last_spec is not None and form.last_spec.synth is not None
            assert form.last_spec.klass == "interactive"
            row = await _launched_row(pilot, "from-form")
            started.append(row.peer.pid)
            assert row.peer.weight == 3.0 and row.gpu_key == gpu_key
            assert _slot_flags(gpu_key, row.peer.pid) & abi.FLAG_INTERACTIVE  # `synth --class interactive`
            said = f"synthetic engine pid {row.peer.pid} (slot "
            await until(pilot, lambda: any(said in n for n in notes(app)), what=f"{said!r} in {notes(app)}")
            assert psutil.Process(row.peer.pid).cmdline()[3] == "synth"

    try:
        asyncio.run(main())
    finally:
        for pid in started:
            _end(pid)


def _slot_flags(gpu_key: str, pid: int) -> int:
    with Segment.attach_readonly(segment.shm_path(gpu_key)) as seg:
        return next(r.flags for r in seg.read_slots() if r.pid == pid)


# per kind: a value its check rejects (field, what the inline error says)
BAD_KIND_VALUES = {
    "llama-server": ("model", "/nonexistent/m.gguf", "no such file"),
    "vllm": ("command", "vllm serve 'unclosed", "cannot split"),
    "sglang": ("command", "no-such-sglang-xyz --port 30000", "not on PATH"),
    "tgi": ("command", f"{sys.executable} --port 99999", "must be 1..65535"),
    "command": ("health_url", "localhost:1", "http:// or https://"),
    "synth": ("step_ms", "0", "must be between"),
}


def test_the_form_renders_every_kind_of_core_kinds_and_shows_its_errors_inline(gpu_key, tmp_path):
    """Each kind of core/engines/kinds.py is offered; selecting it shows its fields (a closed set as a
    selector) and the common ones (the class: a selector, batch); a bad value is shown at its field
    and nothing is started."""
    calls: list[LaunchSpec] = []

    def runner(spec: LaunchSpec) -> LaunchReply:
        calls.append(spec)
        raise AssertionError("nothing is started")

    async def main():
        app = DashboardApp(gpu_key=gpu_key, interval_s=0.2, launch_runner=runner)
        async with app.run_test(size=SIZE) as pilot:
            form = await open_form(pilot)
            offered = [v for _, v in form.query_one("#f-kind", Select)._options if v != Select.BLANK]
            assert offered == [k.key for k in KINDS]
            assert isinstance(form.query_one("#f-class"), Select) and form.values()["class"] == "batch"
            for key in ("vllm", "command"):  # a command left at one kind's default becomes the next kind's
                form.query_one("#f-kind", Select).value = key
                assert form.shown_kind == key  # the switch is made as the value is set
                assert form.values()["command"] == KIND_BY_KEY[key].defaults()["command"]
            form.query_one("#f-command", Input).value = "my-own --cmd"
            form.query_one("#f-kind", Select).value = "tgi"
            assert form.shown_kind == "tgi"
            assert form.values()["command"] == "my-own --cmd"  # what was typed stays
            form.query_one("#f-command", Input).value = ""
            for kind in KINDS:
                form.query_one("#f-kind", Select).value = kind.key
                own = {f.key for f in kind.fields}
                assert form.shown_kind == kind.key
                target = {f.key for f in SLO} if kind.supervised else set()  # a synthetic engine has no proxy
                assert {f.key for f in FIELDS if form.query_one(f"#r-{f.key}").display} == own | target | {
                    "weight",
                    "class",
                    "name",
                    "gpu_key",
                }, kind.key
                for f in kind.fields:
                    assert isinstance(form.query_one(f"#f-{f.key}"), Select if f.choices else Input)
                    if f.key != "binary":  # llama-server's: the one found here
                        assert form.values()[f.key] == f.default, (kind.key, f.key)
                field, bad, needle = BAD_KIND_VALUES[kind.key]
                if "binary" in own:  # a binary that exists, whatever this host's PATH finds: the model is checked
                    form.query_one("#f-binary", Input).value = sys.executable
                form.query_one(f"#f-{field}").value = bad
                await press_launch(pilot, form)
                assert field in form.errors, (kind.key, form.errors)
                assert needle in form.errors[field], form.errors
                assert needle in str(form.query_one(f"#e-{field}", Static).render())
                assert "nothing was started" in form.status_text and app.screen is form
                form.query_one(f"#f-{field}").value = ""
            assert calls == []

    asyncio.run(main())


def test_a_kind_switch_is_made_as_it_is_selected_and_never_undoes_what_is_typed_after_it(gpu_key, monkeypatch):
    """The kind's switch (its fields, their defaults) is made in the assignment of the selector's value. Its
    Changed message reaches the form later (it bubbles through the rows; each selector also posts one as it
    mounts): it must change nothing then: a field cleared right after the switch stays cleared, and the
    errors a submit showed meanwhile stay shown (a reset at the message emptied both)."""
    arrived: list[object] = []
    handled = LaunchForm.on_select_changed

    def on_select_changed(form: LaunchForm, event: Select.Changed) -> None:
        handled(form, event)
        arrived.append(event.value if event.select.id == "f-kind" else None)

    monkeypatch.setattr(LaunchForm, "on_select_changed", on_select_changed)

    async def main():
        app = DashboardApp(gpu_key=gpu_key, interval_s=0.2, launch_runner=lambda spec: pytest.fail("started"))
        async with app.run_test(size=SIZE) as pilot:
            form = await open_form(pilot)
            form.query_one("#f-kind", Select).value = "vllm"
            assert form.shown_kind == "vllm" and "vllm" not in arrived  # switched before its message came
            assert form.values()["command"] == KIND_BY_KEY["vllm"].defaults()["command"]
            form.query_one("#f-command", Input).value = ""
            form.submit()
            assert "command" in form.errors
            await until(pilot, lambda: "vllm" in arrived, what="the kind selector's Changed at the form")
            assert form.values()["command"] == "" and "command" in form.errors, form.errors
            assert not form.query_one("#e-command", Static).has_class("-empty")

    asyncio.run(main())


def test_launch_form_starts_a_real_command_engine_with_its_class(gpu_key, tmp_path, runtime_dir, monkeypatch):
    """The `command` kind (any program, through declaration.kind_engine): the form starts it under a real
    supervisor (activity always, no health check), and it joins as managed with the class chosen."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    started: list[int] = []

    async def main():
        app = DashboardApp(gpu_key=gpu_key, interval_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            form = await open_form(pilot)
            form.query_one("#f-kind", Select).value = "command"  # its defaults are set now, before the values below
            assert form.shown_kind == "command"
            command = f"{sys.executable} -c 'import time; time.sleep(60)'"
            values = {"command": command, "weight": "2", "name": "cmd-from-form", "health_url": ""}
            for k, v in values.items():
                form.query_one(f"#f-{k}").value = v
            form.query_one("#f-activity", Select).value = "always"
            form.query_one("#f-class", Select).value = "interactive"
            await press_launch(pilot, form)
            await until(pilot, lambda: not isinstance(app.screen, LaunchForm), timeout=60, what="launched")
            spec = form.last_spec
            assert spec is not None, (form.errors, form.status_text, notes(app))
            assert spec.engine_argv == (sys.executable, "-c", "import time; time.sleep(60)")
            assert (spec.sources.activity, spec.sources.no_health, spec.klass) == ("always", True, "interactive")
            row = await _launched_row(pilot, "cmd-from-form")
            started.append(row.peer.pid)
            sup = psutil.Process(row.peer.pid).ppid()
            started.insert(0, sup)
            assert psutil.Process(sup).cmdline()[3] == "run"
            assert row.peer.weight == 2.0 and row.gpu_key == gpu_key
            assert _slot_flags(gpu_key, row.peer.pid) & abi.FLAG_INTERACTIVE
            said = f"engine pid {row.peer.pid} "
            await until(pilot, lambda: any(said in n for n in notes(app)), what=f"{said!r} in {notes(app)}")

    try:
        asyncio.run(main())
    finally:
        _end_launched(started)


def test_the_form_launches_an_engine_with_a_latency_target_that_its_status_shows(
    gpu_key, tmp_path, runtime_dir, monkeypatch
):
    """The form's SLO fields (run/launch's --slo-* options): a bad value is one message at its field and nothing
    is started; a good target reaches the real supervisor's governor: the engine's `status` (its control socket)
    and the dashboard's row show the target and the bounds."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    started: list[int] = []

    async def main():
        app = DashboardApp(gpu_key=gpu_key, interval_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            form = await open_form(pilot)
            form.query_one("#f-kind", Select).value = "command"
            assert all(form.query_one(f"#r-{f.key}").display for f in SLO)
            values = {"command": f"{sys.executable} -c 'import time; time.sleep(60)'", "weight": "2", "name": "slo-ff"}
            for k, v in {**values, "health_url": "", "slo_ttft_p99_ms": "fast", "slo_weight_max": "6"}.items():
                form.query_one(f"#f-{k}").value = v
            form.query_one("#f-activity", Select).value = "always"
            await press_launch(pilot, form)
            assert form.errors == {"slo_ttft_p99_ms": "'fast': must be a number > 0"}
            assert "must be a number > 0" in str(form.query_one("#e-slo_ttft_p99_ms", Static).render())
            assert "nothing was started" in form.status_text and app.screen is form
            form.query_one("#f-slo_ttft_p99_ms", Input).value = "250"
            form.query_one("#f-slo_weight_min", Input).value = "8"
            await press_launch(pilot, form)
            assert form.errors == {"slo_weight_max": "weight_min 8 is above weight_max 6"}
            form.query_one("#f-slo_weight_min", Input).value = ""
            form.query_one("#f-slo_classes", Select).value = "interactive"
            await press_launch(pilot, form)
            await until(pilot, lambda: not isinstance(app.screen, LaunchForm), timeout=60, what="launched")
            assert form.last_spec is not None and form.last_spec.slo is not None
            row = await _launched_row(pilot, "slo-ff")
            started.append(row.peer.pid)
            started.insert(0, psutil.Process(row.peer.pid).ppid())
            st = control.StatusReply.from_json(control.request(row.peer.pid, "status"))
            assert st.slo is not None
            assert (st.slo.ttft_p99_ms, st.slo.itl_p99_ms) == (250.0, None)
            assert (st.slo.weight_min, st.slo.weight_max, st.slo.classes) == (2.0, 6.0, "interactive")
            shown = await until(
                pilot,
                lambda: next(
                    (r.engine.slo for r in app.query_one(PeersTable)._rows.values() if r.engine and r.engine.slo), None
                ),
                what="the target in the dashboard's row",
            )
            assert shown.ttft_p99_ms == 250.0 and shown.weight_max == 6.0

    try:
        asyncio.run(main())
    finally:
        _end_launched(started)


def test_the_demos_form_starts_a_synthetic_engine_that_ends_with_the_demo(runtime_dir, tmp_path, monkeypatch):
    """In the demo the form starts a synthetic engine by default (no model needed); stopping the
    demo ends it and removes its log and the segment."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    key = unique_key("demo")
    demo = start_demo(key)
    pids: list[int] = []

    async def main():
        def launch(spec):
            return launch_in_worker(spec, started=demo.adopt)

        app = DashboardApp(gpu_key=key, interval_s=0.2, launch_runner=launch, demo=True)
        async with app.run_test(size=SIZE) as pilot:
            form = await open_form(pilot)
            assert form.kind == "synth" and "end with it" in form.status_text + str(
                form.query_one("#launch-status").render()
            )
            assert form.values()["work_units"] == ""  # step_ms's work, as the demo engines': their TOK/S compare
            await press_launch(pilot, form)  # every default is valid: name "synth", weight 1, step 5 ms
            await until(pilot, lambda: not isinstance(app.screen, LaunchForm), timeout=60, what="launched")
            assert form.last_spec is not None and form.last_spec.synth is not None
            assert form.last_spec.synth.work_units is None
            row = await _launched_row(pilot, "synth")
            pids.append(row.peer.pid)

    try:
        asyncio.run(main())
        assert [pid for pid, _ in demo.launched] == pids and len(pids) == 1
        log = demo.launched[0][1]
        assert os.path.exists(log)
    finally:
        stop_demo(demo)
        for pid in pids:
            _end(pid)
    assert not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE
    assert not os.path.exists(log) and not os.path.exists(shm_file(key))


@pytest.mark.parametrize(
    ("kw", "shown", "not_shown"),
    [
        ({"demo": True}, ["the demo's engines on /opencoti-gpu-k1", "`l` launches one more"], ["gpushare-tui demo"]),
        ({}, ["launch --weight W -- llama-server", "add --gpu-key KEY", "try `gpushare-tui demo`"], []),
        ({"gpu_key": "k1"}, ["`gpushare-tui launch --gpu-key k1 --weight W -- llama-server -m MODEL`"], ["KEY"]),
    ],
)
def test_the_first_frames_hint_suits_where_it_is_shown(kw, shown, not_shown):
    """Before any engine shows: the demo does not suggest the demo; a --gpu-key dashboard suggests a
    launch on that key (one without a GPU fails otherwise), and without one says to add it."""
    kw = {"gpu_key": "k1", **kw} if kw.get("demo") else kw

    async def main():
        app = DashboardApp(FixedSource([DashboardModel(NOW, ())]), interval_s=3600, **kw)
        async with app.run_test(size=SIZE) as pilot:
            first = str(app.query_one("#empty").render())  # the first frame: no model yet
            await until(pilot, lambda: app.models_seen, what="first model")
            empty = app.query_one("#empty")
            assert not empty.has_class("-hidden")
            text = " ".join(str(empty.render()).split())
            assert " ".join(first.split()) == text
            for s in shown:
                assert s in text, text
            for s in not_shown:
                assert s not in text, text

    asyncio.run(main())
