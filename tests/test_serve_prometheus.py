"""A real Prometheus scrapes a real `serve` every second over real peers (two synth engines and the
independent writer): shares for weights 2/1/1 read 0.5/0.25/0.25 through Prometheus' HTTP API, and a
SIGKILLed peer's share is gone from it within 6 s. `promtool check metrics` passes on a live scrape."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import httpx
import pytest
from serve_env import get, start_serve, start_writer

from testkit.cli import cli_argv
from testkit.wait import wait_for

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
GONE_WITHIN_S = 6.0  # the bound: 3 s liveness + 1 s scrape + slack

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (os.access(PROMETHEUS, os.X_OK) and os.access(PROMTOOL, os.X_OK)),
        reason="prometheus/promtool not installed (Debian package `prometheus`; scripts/test.sh installs it)",
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tmpdir_() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="gst-prom-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start_prometheus(procs, workdir: str, target: str) -> str:
    """A Prometheus scraping `target` (host:port) every second; its base URL once ready."""
    config = os.path.join(workdir, "prometheus.yml")
    with open(config, "w") as f:
        f.write(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
            f"scrape_configs:\n  - job_name: gpushare\n    static_configs:\n      - targets: ['{target}']\n"
        )
    port = _free_port()
    procs.start(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={os.path.join(workdir, 'data')}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(url + "/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, timeout=90, interval=0.2, what="prometheus to be ready")
    return url


def query(prom: str, promql: str) -> dict:
    r = httpx.get(prom + "/api/v1/query", params={"query": promql}, timeout=10)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["status"] == "success", doc
    return doc


def shares_by_name(doc: dict) -> dict[str, float]:
    return {s["metric"]["name"]: float(s["value"][1]) for s in doc["data"]["result"]}


def test_prometheus_scrapes_serve(procs, new_gpu_key, tmpdir_) -> None:
    key = new_gpu_key("prom")
    start_writer(procs, key, "1:writer")  # creates the segment: the synths join it
    heavy = procs.start(cli_argv("synth", "--gpu-key", key, "--weight", "2", "--name", "heavy", "-q"))
    light = procs.start(cli_argv("synth", "--gpu-key", key, "--weight", "1", "--name", "light", "-q"))
    _, serve_url = start_serve(procs, "--gpu-key", key)
    prom = start_prometheus(procs, tmpdir_, serve_url.removeprefix("http://"))

    promql = f'gpushare_peer_share_ratio{{gpu_key="{key}"}}'
    want = {"heavy": 0.5, "light": 0.25, "writer": 0.25}

    def all_three() -> dict | None:
        doc = query(prom, promql)
        got = shares_by_name(doc)
        return doc if got.keys() == want.keys() and all(abs(got[n] - v) < 1e-9 for n, v in want.items()) else None

    doc = wait_for(all_three, timeout=60, interval=0.3, what=f"prometheus to read shares {want}")
    print("prometheus query", promql, "->", json.dumps(doc))
    assert {s["metric"]["job"] for s in doc["data"]["result"]} == {"gpushare"}
    pids = {s["metric"]["name"]: int(s["metric"]["pid"]) for s in doc["data"]["result"]}
    assert pids["heavy"] == heavy.pid and pids["light"] == light.pid

    # a live scrape passes promtool's checks
    scrape = get(serve_url + "/metrics").text
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=scrape, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr

    # a SIGKILLed peer's share is gone from Prometheus (and the others' shares follow)
    procs.kill(light)
    killed_at = time.monotonic()

    def light_gone() -> dict | None:
        got = shares_by_name(query(prom, promql))
        return got if "light" not in got else None

    got = wait_for(light_gone, timeout=30, interval=0.2, what="the killed peer's share to leave prometheus")
    took_s = time.monotonic() - killed_at
    print(f"killed peer gone from prometheus after {took_s:.2f} s")
    assert took_s <= GONE_WITHIN_S, f"the killed peer's share lasted {took_s:.1f} s in prometheus"
    assert set(got) <= {"heavy", "writer"}

    def two_left() -> dict | None:
        got = shares_by_name(query(prom, promql))
        return got if set(got) == {"heavy", "writer"} else None

    final = wait_for(two_left, timeout=30, interval=0.3, what="the remaining shares")
    assert final["heavy"] == pytest.approx(2 / 3) and final["writer"] == pytest.approx(1 / 3)
