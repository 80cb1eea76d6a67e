"""Hostile remote hosts (issue 17): a loopback host plays each attack for real against `--once --remote`
and the dashboard's RemoteSource: a reply dripped a byte every 0.5 s, a huge reply, JSON nested 10^5
deep, values out of the spec's ranges, 3,000 GPUs. Each is an error row (or a capped view) within the
budget, never a hang, a crash or a freeze; the local view never waits for a remote one; a crashed
dashboard exits non-zero. Hypothesis fuzzes the parser: arbitrary JSON or bytes in, an error or a valid
report out."""

from __future__ import annotations

import copy
import json
import math
import os
import pty
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_env import start_writer

from gpushare_tui.core.host.budgets import REMOTE_DEADLINE_S, REMOTE_MAX_GPUS, REMOTE_MAX_JSON_DEPTH
from gpushare_tui.core.registry import abi
from gpushare_tui.core.schedule.v1 import PERIOD_MAX_MS, PERIOD_MIN_MS
from gpushare_tui.dashboard.remote import RemoteSource, check_depth, host_view, parse_report
from gpushare_tui.dashboard.source import LiveSource
from testkit.http import HostileHost, http_reply

URL = "http://192.0.2.1:9464"


def _peer(**over: object) -> dict:
    p = {
        "slot": 0,
        "pid": 4242,
        "name": "alpha",
        "weight": 1.0,
        "share_pct": 100.0,
        "window_us": [0, 80_000],
        "busy_pct": 50.0,
        "active": True,
        "alive": True,
        "heartbeat_age_ms": 12.5,
        "boot_us": 1_700_000_000_000_000,
        "achieved_pct": 100.0,
    }
    return {**p, **over}


def _gpu(key: str = "k0", peers: list | None = None, **over: object) -> dict:
    g = {
        "gpu_key": key,
        "segment": f"/opencoti-gpu-{key}",
        "period_ms": 80,
        "self": None,
        "peers": [_peer()] if peers is None else peers,
        "owner": "someone",
        "owner_uid": 1000,
        "mode": "0600",
    }
    return {**g, **over}


def _report(gpus: list | None = None) -> dict:
    return {
        "schema_version": 1,
        "hostname": "h",
        "timestamp": 1.8e9,
        "gpus": [_gpu()] if gpus is None else gpus,
        "errors": [],
    }


def _body(doc: object) -> bytes:
    return json.dumps(doc).encode()


def _assert_valid(r) -> None:
    """Everything a report carries is inside the spec's ranges (what the views and the UI rely on)."""
    assert len(r.gpus) <= REMOTE_MAX_GPUS
    for g in r.gpus:
        abi.validate_gpu_key(g.gpu_key)
        assert g.period_ms is None or PERIOD_MIN_MS <= g.period_ms <= PERIOD_MAX_MS
        assert len(g.peers) <= abi.SLOT_COUNT and len({p.slot for p in g.peers}) == len(g.peers)
        for p in g.peers:
            assert 0 <= p.slot < abi.SLOT_COUNT and 0 < p.pid < 2**32
            assert 0 <= p.share_pct <= 100 and 0 <= p.busy_pct <= 100
            assert p.achieved_pct is None or 0 <= p.achieved_pct <= 100
            assert p.weight is None or (math.isfinite(p.weight) and p.weight > 0)
            if p.window_us is not None:
                assert g.period_ms is not None and 0 <= p.window_us[0] <= p.window_us[1] <= g.period_ms * 1000
    host_view(r)  # the dashboard's view of it builds


# -- the parser, one hostile value at a time -------------------------------------------------------------


def test_a_valid_report_parses() -> None:
    r = parse_report(URL, _body(_report()))
    assert r.error is None and [g.gpu_key for g in r.gpus] == ["k0"] and r.gpus[0].peers[0].name == "alpha"
    _assert_valid(r)


@pytest.mark.parametrize(
    "gpu_over, peer_over",
    [
        ({"period_ms": 0}, {"window_us": None}),  # was a ZeroDivisionError crash
        ({"period_ms": -80}, {"window_us": None}),  # was a UI frozen at 99 % CPU
        ({"period_ms": 79}, {"window_us": None}),
        ({"period_ms": 401}, {}),
        ({"period_ms": 10**400}, {}),
        ({}, {"busy_pct": 1e308}),  # was an OverflowError crash
        ({}, {"share_pct": 1e308}),
        ({}, {"share_pct": -1}),
        ({}, {"achieved_pct": 100.5}),
        ({}, {"window_us": [0, 90_000]}),  # past the 80 ms period
        ({}, {"window_us": [50_000, 10_000]}),
        ({"period_ms": None}, {}),  # a window without a period
        ({}, {"weight": -1.0}),
        ({}, {"weight": 0}),
        ({}, {"weight": 1e39}),  # no f32
        ({}, {"slot": 16}),
        ({}, {"slot": -1}),
        ({}, {"pid": 0}),
        ({}, {"pid": 2**40}),
        ({}, {"heartbeat_age_ms": -5}),
        ({}, {"boot_us": 2**70}),
        ({"gpu_key": "../../etc"}, {}),
    ],
)
def test_out_of_range_values_are_an_error_row(gpu_over, peer_over) -> None:
    r = parse_report(URL, _body(_report([_gpu(peers=[_peer(**peer_over)], **gpu_over)])))
    assert r.error is not None and r.error.startswith("bad JSON") and r.gpus == ()
    views, errors = host_view(r)
    assert views == [] and [e.segment for e in errors] == [URL]


def test_peer_caps() -> None:
    seventeen = [_peer(slot=i % 16, pid=100 + i, window_us=None) for i in range(17)]
    assert "more than 16 peers" in (parse_report(URL, _body(_report([_gpu(peers=seventeen)]))).error or "")
    twins = [_peer(window_us=None), _peer(pid=7, window_us=None)]
    assert "two peers in one slot" in (parse_report(URL, _body(_report([_gpu(peers=twins)]))).error or "")


def test_timestamp_1e308_is_not_an_overflow() -> None:
    doc = _report()
    doc["timestamp"] = 1e308
    r = parse_report(URL, _body(doc), wall_s=lambda: 1.8e9)
    assert r.error is None and r.gpus[0].now_us == int(1.8e9 * 1e6)


def test_deep_nesting_is_refused_before_parsing() -> None:
    deep = b'{"gpus": ' + b"[" * 100_000 + b"]" * 100_000 + b', "errors": []}'
    t0 = time.monotonic()
    r = parse_report(URL, deep)
    assert time.monotonic() - t0 < 1.0
    assert r.error is not None and "nested deeper" in r.error
    check_depth(_body(_report()))  # a real report nests 6 deep
    check_depth(b'{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}')  # brackets in a string are text
    with pytest.raises(Exception, match="nested deeper"):
        check_depth(b"[" * (REMOTE_MAX_JSON_DEPTH + 1) + b"]" * (REMOTE_MAX_JSON_DEPTH + 1))


def test_three_thousand_gpus_are_capped() -> None:
    """3,000 GPUs in a 1.3 MB reply froze the UI: at most REMOTE_MAX_GPUS are shown, the rest counted."""
    doc = _report([_gpu(f"g{i}") for i in range(3000)])
    body = _body(doc)
    t0 = time.monotonic()
    r = parse_report(URL, body)
    views, errors = host_view(r)
    assert time.monotonic() - t0 < 1.0, "parsing 3,000 GPUs took over a second"
    assert r.error is None and len(views) == REMOTE_MAX_GPUS
    assert any(f"{3000 - REMOTE_MAX_GPUS} more GPUs not shown" in e.error for e in errors)


# -- fuzzing ----------------------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=30,
)
REPORT_PATHS = [
    ("timestamp",),
    ("gpus",),
    ("errors",),
    ("gpus", 0),
    ("gpus", 0, "period_ms"),
    ("gpus", 0, "peers"),
    ("gpus", 0, "gpu_key"),
    ("gpus", 0, "mode"),
    ("gpus", 0, "owner_uid"),
    *[("gpus", 0, "peers", 0, k) for k in _peer()],
    ("gpus", 0, "peers", 0),
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(REPORT_PATHS), value=JSON_VALUES)
def test_fuzz_one_field_of_a_valid_report(path, value) -> None:
    """Any JSON value in any field of a valid report: an error report, or one inside the spec's ranges."""
    doc = copy.deepcopy(_report())
    where = doc
    for k in path[:-1]:
        where = where[k]
    where[path[-1]] = value
    try:
        body = json.dumps(doc).encode()
    except ValueError:
        return
    t0 = time.monotonic()
    r = parse_report(URL, body)
    assert time.monotonic() - t0 < REMOTE_DEADLINE_S
    if r.error is None:
        _assert_valid(r)


@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUES)
def test_fuzz_any_json_document(value) -> None:
    r = parse_report(URL, json.dumps(value).encode())
    if r.error is None:
        _assert_valid(r)


@settings(max_examples=300, deadline=None)
@given(
    body=st.binary(max_size=2000) | st.text(alphabet='[]{}",:0123456789.e-tfalsnu \\', max_size=3000).map(str.encode)
)
def test_fuzz_any_bytes(body) -> None:
    r = parse_report(URL, body)
    if r.error is None:
        _assert_valid(r)


# -- over the network, for real ---------------------------------------------------------------------------


@pytest.mark.slow
def test_once_remote_against_a_drip_host_is_bounded(cli) -> None:
    """A host dripping its status line and headers one byte every 0.5 s hung `--once --remote` (~14 h):
    it is an error row after the overall deadline."""
    with HostileHost(drip_s=0.5) as drip:
        t0 = time.monotonic()
        r = cli("--once", "--no-local", "--remote", drip.url, timeout=30)
        took_s = time.monotonic() - t0
    assert r.returncode == 1, r.stderr  # only an error row: nothing could be read
    assert f"error: {drip.url}: timeout after {REMOTE_DEADLINE_S:g} s" in r.stdout.splitlines()
    assert took_s < REMOTE_DEADLINE_S + 8


@pytest.mark.slow
@pytest.mark.parametrize(
    "raw, error",
    [
        (http_reply(b"[" * 100_000 + b"]" * 100_000), "nested deeper"),  # was a RecursionError traceback, exit 1
        (http_reply(b" " * (3 * 2**20)), "reply larger than"),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b" " * (3 * 2**20), "reply larger than"),  # no length
        (http_reply(_body(_report([_gpu(period_ms=0, peers=[_peer(window_us=None)])]))), "'period_ms' is out"),
        (http_reply(_body(_report([_gpu(peers=[_peer(busy_pct=1e308)])]))), "'busy_pct' is out"),
    ],
    ids=["deep", "huge", "huge-unframed", "period-0", "busy-1e308"],
)
def test_once_remote_hostile_replies_are_error_rows(cli, raw, error) -> None:
    with HostileHost(raw) as host:
        r = cli("--once", "--json", "--no-local", "--remote", host.url, timeout=30)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr  # only an error row: exit 1
    doc = json.loads(r.stdout)
    assert doc["gpus"] == [] and [e["host"] for e in doc["errors"]] == [host.url]
    assert error in doc["errors"][0]["error"]


@pytest.mark.slow
def test_local_view_never_waits_for_a_dripping_host(procs, gpu_key) -> None:
    """The dashboard's source: the local segment is in the first model at once while a remote drips (it was
    never shown: the fetch ran on the local collector); the drip becomes an error row at the deadline."""
    start_writer(procs, gpu_key, "1:local-engine")
    with HostileHost(drip_s=0.5) as drip:
        src = RemoteSource(LiveSource(gpu_key), [drip.url])
        try:
            t0 = time.monotonic()
            m = src.collect()
            assert time.monotonic() - t0 < 1.0
            assert [r.peer.name for r in m.rows()] == ["local-engine"] and m.errors == ()
            deadline = time.monotonic() + REMOTE_DEADLINE_S + 8
            while not src.collect().errors:
                assert time.monotonic() < deadline, "the dripping host never became an error row"
                time.sleep(0.1)
            assert "timeout" in src.collect().errors[0].error
        finally:
            src.close()


@pytest.mark.slow
def test_dashboard_shows_local_rows_while_a_remote_drips(procs, gpu_key) -> None:
    import asyncio

    from gpushare_tui.app import DashboardApp
    from gpushare_tui.widgets.peers_table import PeersTable

    start_writer(procs, gpu_key, "1:local-engine")
    with HostileHost(drip_s=0.5) as drip:

        async def main() -> None:
            app = DashboardApp(interval_s=0.2, source=RemoteSource(LiveSource(gpu_key), [drip.url]))
            async with app.run_test(size=(120, 40)) as pilot:
                table = app.query_one(PeersTable)
                t0 = time.monotonic()
                while table.row_count < 1:
                    assert time.monotonic() - t0 < REMOTE_DEADLINE_S, "the local row waited for the remote"
                    await pilot.pause(0.05)
                assert [table.row(k).peer.name for k in table.order] == ["local-engine"]

        asyncio.run(main())


CRASHING_DASHBOARD = """
import sys
import gpushare_tui.app as app

def boom(self, model):
    raise RuntimeError("a bug in the App")

app.DashboardApp.apply_model = boom
from gpushare_tui.cli import entrypoint
sys.argv = ["gpushare-tui", "--gpu-key", sys.argv[1]]
entrypoint()
"""


@pytest.mark.slow
def test_a_crashed_dashboard_exits_non_zero(gpu_key, tmp_path) -> None:
    """An exception in the App (here a bug put in its model handler) ends the dashboard with a non-zero
    exit status (the shell saw 0), on a real terminal (a pty)."""
    from gpushare_tui.core.registry.segment import Segment

    Segment.create_or_attach(gpu_key).close()
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_DASHBOARD)
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"}
    p = subprocess.Popen([sys.executable, str(script), gpu_key], stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            out.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        code = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        reader.join(timeout=5)
        os.close(master)
    assert code != 0, out[-2000:].decode(errors="replace")
    assert b"a bug in the App" in out
