"""Every view of an engine shows its kind and activity source (issue 19), read from its control socket's
`status` reply (`kind`, `activity`; an older reply without `activity` shows null): the CLI `status`,
the dashboard's ENGINE cell, `--once --json` and `/metrics`."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from slots import NOW, slot, snap

from gpushare_tui.cli import control_cmds
from gpushare_tui.cli import main as cli_main
from gpushare_tui.core.pacing.control import StatusReply
from gpushare_tui.dashboard.columns import engine_text
from gpushare_tui.dashboard.model import DashboardModel, EngineInfo, GpuView, PeerRow, achieved_shares
from gpushare_tui.dashboard.report import ReportData, report_json
from gpushare_tui.dashboard.source import FixedSource, LiveSource
from gpushare_tui.serve.exposition import render_metrics

# pid -> the status reply its control socket gives (920_003: a reply from before issue 19)
REPLIES = {
    920_000: {"ok": True, "state": "running", "kind": "vllm", "activity": "metrics", "port": 8000},
    920_001: {"ok": True, "state": "running", "kind": "command", "activity": "cpu"},
    920_002: {"ok": True, "state": "running", "kind": "llama-server", "activity": "always", "port": 8080},
    920_003: {"ok": True, "state": "running", "kind": "llama-server", "port": 8081},
}


class RepliesControl:
    """A test double for one unit (the control-socket client): the replies above; pid 920_004 has none."""

    def socket_pids(self) -> set[int]:
        return set(REPLIES)

    def is_managed(self, pid: int) -> bool:
        return pid in REPLIES

    def request(self, pid: int, cmd: str, timeout_s: float = 3.0, **kw: object) -> dict:
        assert cmd == "status"
        return dict(REPLIES[pid])


@pytest.fixture
def live_model(tmp_path, monkeypatch) -> DashboardModel:
    from gpushare_tui.core.registry import segment
    from gpushare_tui.core.registry.membership import Membership

    monkeypatch.setattr(segment, "SHM_DIR", str(tmp_path))
    ms = [Membership("kinds", 1.0, f"e{i}", pid=920_000 + i, log=lambda _m: None) for i in range(5)]
    for m in ms:
        m.join()
    src = LiveSource(
        clock=lambda: ms[0].boot_us + 1000, control=RepliesControl(), stats=lambda _k: None, shm_dir=str(tmp_path)
    )
    try:
        yield src.collect()
    finally:
        src.close()
        for m in ms:
            m.leave()


def test_the_status_reply_carries_kind_and_activity() -> None:
    assert StatusReply.from_json(REPLIES[920_000]).activity == "metrics"
    assert StatusReply.from_json(REPLIES[920_003]).activity is None  # older: null
    assert StatusReply.from_json({"ok": True, "activity": 3}).activity is None  # not a string: unknown


def test_live_rows_json_and_metrics_show_kind_and_activity(live_model) -> None:
    rows = {r.peer.pid: r for r in live_model.rows()}
    assert {p: (r.engine.kind, r.engine.activity) for p, r in rows.items() if r.engine} == {
        920_000: ("vllm", "metrics"),
        920_001: ("command", "cpu"),
        920_002: ("llama-server", "always"),
        920_003: ("llama-server", None),
    }
    assert [engine_text(rows[p]) for p in sorted(rows)] == ["vllm", "cmd·cpu", "llama·always", "running", "read-only"]
    doc = report_json(ReportData.of_model(live_model, "h"))
    engines = {p["pid"]: p["engine"] for p in doc["gpus"][0]["peers"]}
    assert {p: e and (e["kind"], e["activity"]) for p, e in engines.items()} == {
        920_000: ("vllm", "metrics"),
        920_001: ("command", "cpu"),
        920_002: ("llama-server", "always"),
        920_003: ("llama-server", None),
        920_004: None,  # no control socket: no engine object
    }
    text = render_metrics(lambda: live_model).decode()
    info = next(f for f in text_string_to_metric_families(text) if f.name == "gpushare_engine_info")
    got = {int(s.labels["pid"]): (s.labels["kind"], s.labels["activity"], s.value) for s in info.samples}
    assert got == {
        920_000: ("vllm", "metrics", 1.0),
        920_001: ("command", "cpu", 1.0),
        920_002: ("llama-server", "always", 1.0),
        920_003: ("llama-server", "", 1.0),
    }
    assert "gpushare_engine_state{" in text  # the existing series stay


def test_engine_cell_text_by_state_and_owner() -> None:
    (p,) = snap([slot(0, 1)]).peers
    cell = lambda **e: engine_text(PeerRow("k", p, True, None, EngineInfo(**e)))  # noqa: E731
    assert cell(state="running", kind="sglang", activity="metrics") == "sglang"
    assert cell(state="running", kind="vllm", activity="cpu") == "vllm·cpu"
    assert cell(state="running", kind="python") == "running"  # a GpuShare engine names no source
    assert cell(state="loading", kind="tgi", activity="metrics") == "loading"  # not running: its state
    assert cell(state="running", kind="command", activity="always", owner_config="/u.toml") == "up cmd·always"
    assert cell(state="stopped", kind="command", activity="always", owner_config="/u.toml") == "up stop"


def test_cli_status_prints_kind_and_activity(monkeypatch, capsys) -> None:
    monkeypatch.setattr(control_cmds, "_ask", lambda *a, **k: (920_000, dict(REPLIES[920_000])))
    assert cli_main(["status", "920000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "      kind: vllm" in lines and "  activity: metrics" in lines
    monkeypatch.setattr(control_cmds, "_ask", lambda *a, **k: (920_003, dict(REPLIES[920_003])))
    assert cli_main(["status", "--json", "920003"]) == 0
    import json

    reply = json.loads(capsys.readouterr().out)
    assert reply["kind"] == "llama-server" and reply["activity"] is None


@pytest.mark.slow
def test_dashboard_engine_cell_shows_kind_and_activity() -> None:
    """Pilot: the rendered table's ENGINE cells."""
    import asyncio

    from gpushare_tui.app import DashboardApp
    from gpushare_tui.widgets.peers_table import PeersTable

    s = snap([slot(i, 1, name=f"e{i}") for i in range(3)])
    engines = [
        EngineInfo(state="running", kind="vllm", activity="metrics"),
        EngineInfo(state="running", kind="command", activity="cpu"),
        EngineInfo(state="running", kind="llama-server", activity="llama"),
    ]
    rows = tuple(PeerRow("k", p, True, None, e) for p, e in zip(s.peers, engines))
    model = DashboardModel(NOW, (GpuView(s, None, rows, achieved_shares(rows)),))

    async def run() -> list[str]:
        app = DashboardApp(FixedSource([model]), interval_s=3600, host="h", clock=lambda: NOW)
        async with app.run_test(size=(120, 30)) as pilot:
            table = app.query_one(PeersTable)
            for _ in range(200):
                if table.row_count == 3:
                    break
                await pilot.pause(0.02)
            return [table.render_line(y).text for y in range(1, 4)]

    lines = asyncio.run(run())
    assert [("vllm" in ln, "cmd·cpu" in ln, "llama" in ln) for ln in lines] == [
        (True, False, False),
        (False, True, False),
        (False, False, True),
    ], lines
