"""The remote view: `--once [--json] --remote URL ...` and the dashboard's RemoteSource read other hosts'
`serve` endpoints; a host that cannot be read is an error row, never a failure."""

from __future__ import annotations

import json
import os
import socket
import socketserver
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest
from serve_env import start_serve, start_writer

from gpushare_tui.core.registry.segment import Segment
from gpushare_tui.dashboard.model import DashboardModel
from gpushare_tui.dashboard.remote import RemoteSource, parse_remote_url
from testkit.cli import cli_argv
from testkit.wait import wait_for


@pytest.fixture
def two_hosts(procs, new_gpu_key) -> tuple[tuple[str, str], tuple[str, str]]:
    """Two `serve`s on different loopback ports, each watching its own key: ((url, key), (url, key))."""
    out = []
    for tag, slots in (("ra", ("2:alpha", "1:beta")), ("rb", ("1:gamma",))):
        key = new_gpu_key(tag)
        start_writer(procs, key, *slots)
        out.append((start_serve(procs, "--gpu-key", key)[1], key))
    return out[0], out[1]


@pytest.fixture
def unreachable() -> Iterator[str]:
    """A URL nobody listens on (a port bound and never listened to)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


class _Garbage(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = b"<html>not json</html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def garbage() -> Iterator[str]:
    """A web server that answers HTML."""
    srv = socketserver.TCPServer(("127.0.0.1", 0), _Garbage)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def mute() -> Iterator[str]:
    """A listener that accepts and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()


@pytest.mark.slow
def test_once_json_two_remotes(cli, two_hosts, unreachable) -> None:
    (a, ka), (b, kb) = two_hosts
    r = cli("--once", "--json", "--no-local", "--remote", a, "--remote", b, "--remote", unreachable)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [(g["host"], g["gpu_key"]) for g in doc["gpus"]] == [(a, ka), (b, kb)]
    assert [p["name"] for p in doc["gpus"][0]["peers"]] == ["alpha", "beta"]
    assert [p["share_pct"] for p in doc["gpus"][0]["peers"]] == pytest.approx([200 / 3, 100 / 3])
    assert [p["name"] for p in doc["gpus"][1]["peers"]] == ["gamma"]
    assert [(e["host"], e["segment"]) for e in doc["errors"]] == [(unreachable, "")]
    assert doc["errors"][0]["error"].startswith("unreachable")


@pytest.mark.slow
def test_once_includes_the_local_host_unless_no_local(cli, two_hosts) -> None:
    (a, ka), _ = two_hosts
    doc = json.loads(cli("--once", "--json", "--remote", a).stdout)
    hosts_of_ka = sorted(g["host"] for g in doc["gpus"] if g["gpu_key"] == ka)
    assert hosts_of_ka == sorted([a, doc["hostname"]])  # the same segment, read here and through a's serve
    table = cli("--once", "--remote", a, "--gpu-key", ka)
    assert table.returncode == 0
    assert [ln.split()[0] for ln in table.stdout.splitlines() if "/opencoti-gpu-" in ln] == [doc["hostname"], a]


@pytest.mark.slow
def test_bad_json_and_timeout_are_error_rows(cli, two_hosts, garbage, mute) -> None:
    (a, ka), _ = two_hosts
    t0 = time.monotonic()
    r = cli("--once", "--no-local", "--remote", garbage, "--remote", mute, "--remote", a)
    took_s = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert f"error: {garbage}: bad JSON: not a gpushare-tui serve reply" in lines
    assert f"error: {mute}: timeout after 2 s" in lines
    assert any(ln.startswith(f"{a}  /opencoti-gpu-{ka}") for ln in lines)
    assert took_s < 30  # the mute host costs its 2 s timeout, not a hang


@pytest.mark.slow
@pytest.mark.parametrize("url", ["127.0.0.1:9464", "ftp://h:1", "http://", "http://h:99999", "http://h:1/?q=1"])
def test_malformed_remote(cli, url) -> None:
    for args in (["--once", "--remote", url], ["--remote", url]):
        r = cli(*args)
        assert (
            r.returncode == 2
            and r.stderr
            == f"gpushare-tui: invalid --remote {url!r}: use http://HOST:PORT (a gpushare-tui serve endpoint)\n"
        )


@pytest.mark.slow
def test_no_local_needs_remote(cli) -> None:
    r = cli("--once", "--no-local")
    assert r.returncode == 2 and "--no-local needs --remote" in r.stderr


def test_parse_remote_url() -> None:
    assert parse_remote_url("http://10.0.0.5:9464/") == "http://10.0.0.5:9464"
    assert parse_remote_url("https://[::1]:9464/gs") == "https://[::1]:9464/gs"


@pytest.mark.slow
def test_remote_source_merges_hosts(two_hosts, unreachable) -> None:
    """The dashboard's source: local model + each host's GPUs keyed HOST/KEY (the host column), unmanaged
    rows (no admin action can reach another host), and an error row per unreadable host."""
    (a, ka), (b, kb) = two_hosts
    src = RemoteSource(None, [a, b, unreachable])
    try:
        assert src.collect().gpus == ()  # the fetches run off the collect: it never waits for them

        def answered() -> DashboardModel | None:
            m = src.collect()
            return m if len(m.gpus) == 2 and m.errors else None

        m = wait_for(answered, timeout=10, what="every host's first report")
        assert [g.gpu_key for g in m.gpus] == [f"{a.removeprefix('http://')}/{ka}", f"{b.removeprefix('http://')}/{kb}"]
        assert [r.peer.name for r in m.rows()] == ["alpha", "beta", "gamma"]
        assert not any(r.managed for r in m.rows())
        assert m.gpus[0].snapshot.period_ms is not None
        assert [(e.segment, e.error.split(":")[0]) for e in m.errors] == [(unreachable, "unreachable")]
        m2 = src.collect()  # the failed host is not asked again at once: its row stays
        assert [e.segment for e in m2.errors] == [unreachable]
    finally:
        src.close()


@pytest.mark.slow
def test_dashboard_shows_remote_rows_read_only(two_hosts, unreachable) -> None:
    """The App over a RemoteSource: a remote host's peers are rows whose GPU column names the host,
    admin actions on them are refused, and an unreachable host is an error, not a failure."""
    import asyncio

    from gpushare_tui.app import DashboardApp
    from gpushare_tui.widgets.peers_table import PeersTable, cell_text
    from gpushare_tui.widgets.weight_modal import WeightModal

    (a, ka), _ = two_hosts

    async def main() -> None:
        app = DashboardApp(interval_s=0.2, source=RemoteSource(None, [a, unreachable]))
        async with app.run_test(size=(120, 40)) as pilot:
            table = app.query_one(PeersTable)
            deadline = time.monotonic() + 20
            while table.row_count < 2:
                assert time.monotonic() < deadline, "remote rows never shown"
                await pilot.pause(0.05)
            rows = [table.row(k) for k in table.order]
            assert [r.peer.name for r in rows] == ["alpha", "beta"]
            assert all(cell_text(r, "gpu").startswith("127.0.0.1:") for r in rows)  # the host first
            assert rows[0].gpu_key == f"{a.removeprefix('http://')}/{ka}"
            assert [e.segment for e in app.model.errors] == [unreachable]
            await pilot.press("w")
            await pilot.pause(0.2)
            assert not isinstance(app.screen, WeightModal)
            assert any("foreign peer" in str(n.message) for n in app._notifications)

    asyncio.run(main())


def _imports(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    r = subprocess.run(cli_argv(*args), capture_output=True, text=True, env=env, timeout=60)
    mods = {ln.rsplit("|", 1)[1].strip() for ln in r.stderr.splitlines() if ln.startswith("import time:")}
    return r, mods


@pytest.mark.slow
def test_httpx_only_with_remote(gpu_key, unreachable) -> None:
    """The headless snapshot imports neither httpx nor the exporter; --remote imports httpx, and no UI."""
    Segment.create_or_attach(gpu_key).close()  # a --gpu-key that matches nothing exits 1
    r, mods = _imports("--once", "--json", "--gpu-key", gpu_key)
    assert r.returncode == 0 and "gpushare_tui.core.observe.snapshot" in mods
    assert not {m.split(".")[0] for m in mods} & {"httpx", "prometheus_client", "textual"}
    r, mods = _imports("--once", "--json", "--remote", unreachable, "--no-local")
    assert r.returncode == 1 and json.loads(r.stdout)["errors"][0]["host"] == unreachable  # only an error row
    assert "httpx" in mods and "textual" not in mods and "gpushare_tui.app" not in mods


def test_peer_json_round_trip_keeps_the_achieved_share() -> None:
    """A remote host's busy-based achieved share reaches the dashboard (null stays None; older hosts omit it)."""
    from gpushare_tui.core.observe.snapshot import build_gpu_snapshot
    from gpushare_tui.core.registry import abi
    from gpushare_tui.dashboard.model import PeerRow
    from gpushare_tui.dashboard.remote import peer_from_json
    from gpushare_tui.dashboard.report import peer_json

    now = 1_800_000_000_000_000
    recs = [
        abi.SlotRecord(i, 100 + i, 2, 7, 1.0, active, now, busy, abi.encode_name(f"p{i}"))
        for i, (active, busy) in enumerate([(1, 300_000), (1, 100_000), (0, 0)])
    ]
    peers = build_gpu_snapshot("k", "/opencoti-gpu-k", recs, now).peers
    assert [peer_from_json(peer_json(PeerRow("k", p))).achieved_pct for p in peers] == [75.0, 25.0, None]
    old = {k: v for k, v in peer_json(PeerRow("k", peers[0])).items() if k != "achieved_pct"}
    assert peer_from_json(old).achieved_pct is None


def test_window_share_round_trips_and_is_computed_for_hosts_that_omit_it() -> None:
    """window_pct reaches the dashboard from a gpushare-tui host; a C peer's (or an older host's) report has
    only share_pct, and the window shares come from its members' weights, as every peer computes them."""
    from gpushare_tui.core.observe.snapshot import build_gpu_snapshot
    from gpushare_tui.core.registry import abi
    from gpushare_tui.dashboard.model import GpuView, PeerRow
    from gpushare_tui.dashboard.remote import gpu_from_json
    from gpushare_tui.dashboard.report import gpu_json

    now = 1_800_000_000_000_000
    recs = [
        abi.SlotRecord(i, 100 + i, 2, 7, abi.to_f32(w), active, now, 0, abi.encode_name(f"p{i}"))
        for i, (w, active) in enumerate([(100.0, 1), (1.0, 1), (1.0, 0)])
    ]
    g = build_gpu_snapshot("k", "/opencoti-gpu-k", recs, now)
    doc = gpu_json(GpuView(g, None, tuple(PeerRow("k", p) for p in g.peers)))
    got = [p.window_pct for p in gpu_from_json(doc).peers]
    assert got == [pytest.approx(90.0), pytest.approx(10.0), None]
    for p in doc["peers"]:
        del p["window_pct"]
    peers = gpu_from_json(doc).peers
    assert [p.window_pct for p in peers] == [pytest.approx(90.0), pytest.approx(10.0), None]
    assert peers[1].floor_lifted
