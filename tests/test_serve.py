"""`gpushare-tui serve`: /metrics, /gpu/peers, /healthz over real segments; one renderer for
`--once --format prometheus`; bad --listen; hostile clients."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_env import get, start_serve, start_writer

from gpushare_tui.dashboard.model import DashboardModel
from gpushare_tui.serve.exposition import METRIC_NAMES
from gpushare_tui.serve.listen import DEFAULT_LISTEN, is_loopback, parse_listen
from gpushare_tui.serve.server import HEADER_DEADLINE_S, MAX_CONNECTIONS
from testkit.cli import cli_argv
from testkit.http import slowloris
from testkit.wait import wait_for

SEED_KEYS = {"gpu_key", "period_ms", "self", "peers"}  # spec §6: a seed engine's /gpu/peers, never renamed
SEED_PEER_FIELDS = {"slot", "pid", "name", "weight", "share_pct", "busy_pct", "active", "alive", "heartbeat_age_ms"}


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """metric name -> its samples (labels, value), parsed by prometheus_client's own parser."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _value(samples: list[tuple[dict[str, str], float]], **labels: str) -> float | None:
    return next((v for got, v in samples if all(got.get(k) == x for k, x in labels.items())), None)


@pytest.mark.slow
def test_metrics_peers_and_healthz(procs, gpu_key) -> None:
    start_writer(procs, gpu_key, "2:big", "1:small", "1:ghost:dead")
    _, url = start_serve(procs, "--gpu-key", gpu_key)

    r = get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    m = _samples(r.text)
    assert set(m) <= METRIC_NAMES
    share, weight = m["gpushare_peer_share_ratio"], m["gpushare_peer_weight"]
    assert _value(share, gpu_key=gpu_key, slot="0", name="big") == pytest.approx(2 / 3)
    assert _value(share, gpu_key=gpu_key, slot="1", name="small") == pytest.approx(1 / 3)
    assert _value(weight, slot="0") == 2.0 and _value(m["gpushare_peer_busy_ratio"], slot="1") == 0.5
    assert _value(m["gpushare_peer_active"], slot="0") == 1.0
    assert _value(m["gpushare_peer_window_seconds"], slot="0") == pytest.approx(
        2 * _value(m["gpushare_peer_window_seconds"], slot="1")
    )
    assert _value(m["gpushare_schedule_period_seconds"], gpu_key=gpu_key) > 0
    assert _value(m["gpushare_peers"], gpu_key=gpu_key) == 2
    assert _value(m["gpushare_segment_errors"]) == 0
    # the dead peer: alive 0 and its heartbeat age, and nothing else
    assert _value(m["gpushare_peer_alive"], slot="2", name="ghost") == 0.0
    assert _value(m["gpushare_peer_heartbeat_age_seconds"], slot="2") > 50
    ghost = {name for name, ss in m.items() for labels, _ in ss if labels.get("name") == "ghost"}
    assert ghost == {"gpushare_peer_alive", "gpushare_peer_heartbeat_age_seconds"}

    r = get(f"{url}/gpu/peers?gpu_key={gpu_key}")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    assert SEED_KEYS <= set(doc) and doc["gpu_key"] == gpu_key and doc["self"] is None and doc["period_ms"] > 0
    assert all(SEED_PEER_FIELDS <= set(p) for p in doc["peers"]) and len(doc["peers"]) == 3
    assert [(p["name"], p["weight"], round(p["share_pct"], 3), p["alive"]) for p in doc["peers"]] == [
        ("big", 2.0, 66.667, True),
        ("small", 1.0, 33.333, True),
        ("ghost", 1.0, 0.0, False),
    ]

    whole = get(url + "/gpu/peers").json()
    assert {"schema_version", "hostname", "timestamp", "gpus", "errors"} <= set(whole)
    assert [g["gpu_key"] for g in whole["gpus"]] == [gpu_key]
    assert [p["managed"] for p in whole["gpus"][0]["peers"]] == [False] * 3  # the raw writer: foreign peers

    r = get(f"{url}/gpu/peers?gpu_key=no-such-key")
    assert r.status_code == 404 and "no-such-key" in r.json()["error"]
    r = get(f"{url}/gpu/peers?gpu_key=../etc")
    assert r.status_code == 400 and "invalid gpu key" in r.json()["error"]
    r = get(url + "/healthz")
    assert r.status_code == 200 and r.text == "ok\n"
    assert get(url + "/nope").status_code == 404


@pytest.mark.slow
def test_gpu_peers_is_the_once_json_report(procs, gpu_key, cli, runtime_dir) -> None:
    """One report builder: `/gpu/peers` carries what `--once --json` does (`managed`, `engine`, ...) for a
    managed engine, and `?gpu_key=K` is that report's entry for K (the seed's fields, and the rest)."""
    synth = procs.start(
        cli_argv("synth", "--weight", "2", "--name", "eng", "--gpu-key", gpu_key, "--step-ms", "2", "-q")
    )
    _, url = start_serve(procs, "--gpu-key", gpu_key)

    def running() -> dict | None:
        doc = get(url + "/gpu/peers").json()
        peers = [p for g in doc["gpus"] for p in g["peers"]]
        return doc if peers and (peers[0]["engine"] or {}).get("state") == "running" else None

    whole = wait_for(running, timeout=20, interval=0.1, what="serve to see the synth engine running")
    r = cli("--once", "--json", "--gpu-key", gpu_key)
    assert r.returncode == 0, r.stderr
    once = json.loads(r.stdout)
    assert list(whole) == list(once)
    (g,) = whole["gpus"]
    (og,) = once["gpus"]
    assert list(g) == list(og) and [list(p) for p in g["peers"]] == [list(p) for p in og["peers"]]
    (p,) = g["peers"]
    assert (p["pid"], p["managed"], p["engine"]["kind"]) == (synth.pid, True, "synth")
    assert list(p["engine"]) == list(og["peers"][0]["engine"])

    one = get(f"{url}/gpu/peers?gpu_key={gpu_key}").json()
    assert SEED_KEYS <= set(one) and one["gpu_key"] == gpu_key and one["self"] is None and one["period_ms"] is None
    assert list(one) == list(g) and [list(q) for q in one["peers"]] == [list(p)]
    assert SEED_PEER_FIELDS <= set(one["peers"][0]) and one["peers"][0]["engine"]["state"] == "running"


@pytest.mark.slow
def test_dead_peer_series_disappear(procs, gpu_key) -> None:
    """A SIGKILLed writer: its share, weight and busy series are gone once its heartbeat is stale."""
    w = start_writer(procs, gpu_key, "1:victim")
    _, url = start_serve(procs, "--gpu-key", gpu_key)
    assert _value(_samples(get(url + "/metrics").text)["gpushare_peer_share_ratio"], name="victim") == 1.0
    procs.kill(w)

    def gone() -> bool:
        m = _samples(get(url + "/metrics").text)
        return "gpushare_peer_share_ratio" not in m and _value(m["gpushare_peer_alive"], name="victim") == 0.0

    wait_for(gone, timeout=20, interval=0.2, what="the killed peer's share to disappear")


@pytest.mark.slow
def test_once_format_prometheus_is_a_scrape(procs, gpu_key, cli) -> None:
    """`--once --format prometheus` prints what /metrics serves for the same segment (heartbeat ages,
    the only values that move between the two reads, left out)."""
    start_writer(procs, gpu_key, "3:a", "1:b")
    _, url = start_serve(procs, "--gpu-key", gpu_key)
    r = cli("--once", "--format", "prometheus", "--gpu-key", gpu_key)
    assert r.returncode == 0, r.stderr
    scrape = get(url + "/metrics").text

    def steady(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if not ln.startswith("gpushare_peer_heartbeat_age_seconds{")]

    assert steady(r.stdout) == steady(scrape)
    assert f'gpushare_peer_share_ratio{{gpu_key="{gpu_key}",name="a",pid=' in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--once", "--format", "prometheus", "--json"], "--json contradicts --format prometheus"),
        (["--once", "--format", "xml"], "invalid --format 'xml'"),
        (["--format", "json"], "--format needs --once"),
    ],
)
def test_format_bad_input(cli, args, fragment) -> None:
    r = cli(*args)
    assert r.returncode == 2 and fragment in r.stderr and "Traceback" not in r.stderr


def test_default_listen_is_loopback() -> None:
    assert DEFAULT_LISTEN == "127.0.0.1:9464"
    assert is_loopback(parse_listen(DEFAULT_LISTEN)[0])


@pytest.mark.slow
@pytest.mark.parametrize("text", ["nonsense", "127.0.0.1", ":9464", "127.0.0.1:http", "127.0.0.1:70000", "[::1"])
def test_listen_unparseable(cli, text) -> None:
    r = cli("serve", "--listen", text)
    assert r.returncode == 2 and r.stderr.startswith(f"gpushare-tui: invalid --listen {text!r}")
    assert len(r.stderr.splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("text", ["999.1.1.1:9464", "example.com:9464", "192.0.2.123:9464"])
def test_listen_bad_address(cli, text) -> None:
    """Not an address, a name (never resolved), an address this host does not have."""
    r = cli("serve", "--listen", text)
    assert r.returncode == 2 and r.stderr.startswith("gpushare-tui: ") and len(r.stderr.splitlines()) == 1
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_listen_port_taken(cli) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = cli("serve", "--listen", f"127.0.0.1:{s.getsockname()[1]}")
    assert r.returncode == 1 and "the port is in use" in r.stderr and len(r.stderr.splitlines()) == 1


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _reply(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


@pytest.mark.slow
def test_hostile_clients(procs, gpu_key) -> None:
    """Bounded: garbage gets a JSON 400; MAX_CONNECTIONS silent clients do not lock /healthz out (the oldest
    one still sending its headers makes room); a silent client is cut off at the header deadline, and so is
    one trickling headers; nothing prints a traceback."""
    start_writer(procs, gpu_key, "1:x")
    serve, url = start_serve(procs, "--gpu-key", gpu_key)
    r = _connect(url)
    r.sendall(b"GARBAGE\r\n\r\n")
    bad = _reply(r)
    assert bad.startswith(b"HTTP/1.1 400 Bad Request") and b"application/json" in bad and b'{"error": ' in bad
    r.close()

    t0 = time.monotonic()
    silent = [_connect(url) for _ in range(MAX_CONNECTIONS)]
    time.sleep(0.5)  # all accepted
    extra = _connect(url)
    extra.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
    assert _reply(extra).startswith(b"HTTP/1.1 200")
    extra.close()
    for s in silent:  # each is closed by the server (evicted, or at the header deadline), not by us
        s.settimeout(HEADER_DEADLINE_S + 10)
        try:
            assert _reply(s) == b""
        except ConnectionResetError:
            pass  # evicted: aborted
        s.close()
    assert time.monotonic() - t0 < HEADER_DEADLINE_S + 10

    # a slow sender (a byte now and then, never finishing its headers) is cut off at the header deadline
    slow = _connect(url)
    t0 = time.monotonic()
    slow.sendall(b"GET /metrics HTTP/1.0\r\n")
    closed = False
    while time.monotonic() - t0 < HEADER_DEADLINE_S + 8:
        try:
            slow.sendall(b"X-A: b\r\n")
            time.sleep(0.25)
        except OSError:
            closed = True
            break
    slow.close()
    assert closed, "a client trickling headers was never cut off"
    assert time.monotonic() - t0 < HEADER_DEADLINE_S + 3

    assert get(url + "/healthz").status_code == 200  # still serving
    serve.terminate()
    assert serve.wait(timeout=10) == 0
    assert "Traceback" not in serve.stderr.read()


@pytest.mark.slow
def test_healthz_under_slowloris(procs) -> None:
    """16 sockets that send one byte and reconnect as soon as they are dropped (issue 17: every probe got 503):
    /healthz still answers >= 95 % of probes within 1 s."""
    serve, url = start_serve(procs)
    stop = threading.Event()
    attackers = slowloris(url, 16, stop)
    try:
        time.sleep(1.0)
        ok = 0
        for _ in range(40):
            t0 = time.monotonic()
            try:
                ok += get(url + "/healthz", timeout_s=1.0).status_code == 200 and time.monotonic() - t0 <= 1.0
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    finally:
        stop.set()
        for t in attackers:
            t.join(timeout=5)
    assert ok >= 38, f"{ok}/40 /healthz probes answered within 1 s under a slowloris"
    serve.terminate()
    assert serve.wait(timeout=10) == 0


class _SlowSource:
    """A LiveSource stand-in (one unit: the Exporter) whose collect takes COLLECT_S."""

    COLLECT_S = 0.2

    def __init__(self) -> None:
        self.calls = 0

    def collect(self) -> DashboardModel:
        self.calls += 1
        time.sleep(self.COLLECT_S)
        return DashboardModel(0, (), (), 0)

    def close(self) -> None:
        pass


def test_concurrent_scrapes_share_one_collect() -> None:
    """8 scrapes at once cost one collect (single-flight), not 8 in a row under one lock; a later one
    (past the model's max age) collects again."""
    from concurrent.futures import ThreadPoolExecutor

    from gpushare_tui.serve.exporter import Exporter

    src = _SlowSource()
    exporter = Exporter(src, max_age_s=0.5)  # type: ignore[arg-type]
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(lambda _: exporter.metrics(), range(8)))
    took_s = time.monotonic() - t0
    assert src.calls == 1 and len(set(bodies)) == 1
    assert took_s < 4 * _SlowSource.COLLECT_S  # 8 in a row took 8 x
    time.sleep(0.6)
    exporter.model()
    assert src.calls == 2


def test_an_engines_view_without_its_segment_says_why() -> None:
    from gpushare_tui.core.observe.snapshot import SegmentProblem, SegmentsRead
    from gpushare_tui.serve.peers import engine_view

    doc = engine_view("k1", 0, SegmentsRead([], [SegmentProblem("/opencoti-gpu-k1", "shrunk")]))
    assert doc == {"gpu_key": "k1", "period_ms": None, "self": None, "peers": [], "error": "shrunk"}
