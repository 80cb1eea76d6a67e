"""Accounting end to end: real synth engines, a real `serve`, a real Prometheus scraping it every second.

The busy counters stay monotonic across many direct scrapes, through an engine restart (a new pid: a new
series) and a `serve` restart (the slot's counter restarts nothing; the GPU's sum, kept by serve, starts
at 0 again: a counter reset Prometheus handles); Prometheus' increase() over them matches what the test
counts itself from its own scrapes."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_serve_prometheus import PROMETHEUS, query, start_prometheus, tmpdir_  # noqa: F401

from testkit.cli import cli_argv
from testkit.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not PROMETHEUS, reason="no prometheus")]

BUSY = "gpushare_peer_busy_seconds_total"
GPU_BUSY = "gpushare_gpu_busy_seconds_total"
SERIES_LABELS = ("name", "pid", "slot", "source")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(procs, key: str, port: int) -> subprocess.Popen:
    p = procs.start(cli_argv("serve", "--listen", f"127.0.0.1:{port}", "--gpu-key", key))
    line = p.stderr.readline()  # type: ignore[union-attr]
    assert re.search(r"listening on http://", line), line
    return p


class Scraper:
    """Direct scrapes of `serve` (the test's own counting): every series' values, checked monotonic."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key
        self.client = httpx.Client(timeout=10)  # one client: a new one loads the CA store every time
        self.last: dict[tuple, float] = {}  # series -> its last value
        self.scrapes = 0
        self.history: list[tuple[float, dict[tuple, float]]] = []

    def scrape(self) -> tuple[float, dict[tuple, float], float | None]:
        text = self.client.get(self.url + "/metrics").text
        t = time.time()
        busy: dict[tuple, float] = {}
        gpu = None
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.labels.get("gpu_key") != self.key:
                    continue
                if s.name == BUSY:
                    busy[tuple(s.labels[k] for k in SERIES_LABELS)] = s.value
                elif s.name == GPU_BUSY:
                    gpu = s.value
        for series, v in busy.items():
            assert v >= self.last.get(series, 0.0), (series, self.last.get(series), v)  # never goes down
            self.last[series] = v
        self.scrapes += 1
        self.history.append((t, busy))
        return t, busy, gpu

    def counted(self, name: str, t0: float, t1: float) -> float:
        """Busy seconds of engine `name` over [t0, t1] by these scrapes: each of its series' rise (one
        that appeared after t0 from 0: it counts since its owner joined)."""
        first: dict[tuple, float] = {}
        last: dict[tuple, float] = {}
        for i, (t, busy) in enumerate(self.history):
            if not t0 <= t <= t1:
                continue
            for series, v in busy.items():
                if series[0] == name:
                    first.setdefault(series, v if i and series in self.history[i - 1][1] or t == t0 else 0.0)
                    last[series] = v
        return sum(last[s] - first[s] for s in last)

    def by_name(self, busy: dict[tuple, float], name: str) -> dict[str, float]:
        return {s[1]: v for s, v in busy.items() if s[0] == name}  # pid -> value


def _increase(prom: str, promql: str, at_s: float) -> float:
    doc = query_at(prom, promql, at_s)
    return sum(float(r["value"][1]) for r in doc["data"]["result"])


def query_at(prom: str, promql: str, at_s: float) -> dict:
    r = httpx.get(prom + "/api/v1/query", params={"query": promql, "time": f"{at_s:.3f}"}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def _synth(procs, key: str, weight: str, name: str) -> subprocess.Popen:
    return procs.start(cli_argv("synth", "--gpu-key", key, "--weight", weight, "--name", name, "-q"))


def _stop(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=15)


def test_counters_monotonic_restarts_and_prometheus_increase(procs, gpu_key, tmpdir_) -> None:  # noqa: F811
    key = gpu_key
    a = _synth(procs, key, "2", "a")
    b = _synth(procs, key, "1", "b")
    port = _free_port()
    serve = _serve(procs, key, port)
    url = f"http://127.0.0.1:{port}"
    prom = start_prometheus(procs, tmpdir_, f"127.0.0.1:{port}")
    me = Scraper(url, key)

    def both_busy() -> bool:
        _, busy, _ = me.scrape()
        return {s[0] for s, v in busy.items() if v > 0} >= {"a", "b"}

    wait_for(both_busy, timeout=60, interval=0.2, what="both engines' busy counters")
    sources = {s[3] for s in me.last}
    assert sources == {"counter"}  # the synth engines keep busy_total_us (the pacer's step time)

    # many scrapes, each series monotonic (Scraper checks); the Prometheus window starts here
    t0, busy0, _ = me.scrape()
    time.sleep(2.5)  # at least two Prometheus scrapes after t0 for its increase()
    started = time.monotonic()
    while me.scrapes < 1000:
        me.scrape()
    print(f"1000 scrapes in {time.monotonic() - started:.1f} s")
    # an engine restart: b's new process is a new series, starting near 0
    old_b = b.pid
    _stop(b)
    b = _synth(procs, key, "1", "b")
    wait_for(lambda: str(b.pid) in me.by_name(me.scrape()[1], "b"), timeout=60, interval=0.2, what="new b series")
    t_mid, busy_mid, _ = me.scrape()
    assert me.by_name(busy_mid, "b")[str(b.pid)] < 5.0
    assert str(old_b) not in me.by_name(busy_mid, "b")  # gone with its owner
    time.sleep(4)
    # a serve restart: the slots' counters carry on (no reset, no double counting); serve's own sum restarts
    t_before, busy_before, gpu_before = me.scrape()
    serve.send_signal(signal.SIGTERM)
    serve.wait(timeout=15)
    serve = _serve(procs, key, port)
    t_after, busy_after, gpu_after = me.scrape()
    for series, v in busy_before.items():
        if series in busy_after:
            assert busy_after[series] >= v  # Scraper asserts it too: read from the slot, not restarted
    assert gpu_after is not None and gpu_before is not None and gpu_after < gpu_before  # serve's sum: from 0
    time.sleep(6)
    t1, busy1, _ = me.scrape()
    time.sleep(2.5)  # Prometheus has scraped past t1

    window = t1 - t0
    for name in ("a", "b"):
        got = _increase(prom, f'increase({BUSY}{{gpu_key="{key}",name="{name}"}}[{round(window * 1000)}ms])', t1)
        counted = me.counted(name, t0, t1)
        print(f"{name}: prometheus increase {got:.2f} s, own count {counted:.2f} s over {window:.1f} s")
        # Prometheus extrapolates to the window's edges from 1 s scrapes; a new series' first second is
        # not in increase(): within 1.5 s per series plus 5 %
        assert abs(got - counted) <= 1.5 * 2 + 0.05 * counted, (name, got, counted)
    total = _increase(prom, f'sum(increase({BUSY}{{gpu_key="{key}"}}[{round(window * 1000)}ms]))', t1)
    gpu = _increase(prom, f'increase({GPU_BUSY}{{gpu_key="{key}"}}[{round(window * 1000)}ms])', t1)
    print(f"Σ increase {total:.2f} s, gpu increase {gpu:.2f} s, window {window:.2f} s, scrapes {me.scrapes}")
    # no double counting: neither exceeds the wall time (one engine runs at a time) by more than slack
    assert total <= window * 1.1 + 1.0 and gpu <= window * 1.1 + 1.0
    assert gpu >= 0.3 * window  # the reset of serve's sum is handled as a reset, not lost altogether
    for p in (a, b):
        _stop(p)
    me.client.close()
