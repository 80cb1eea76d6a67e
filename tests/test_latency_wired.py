"""Latency end to end, real processes: `gpushare-tui run` fronts a vLLM-preset engine (testkit's openai_engine, its
TTFT and inter-token gap injected) and a real llama-server with its front proxy; requests to the public port show
in `status NAME`, `--once --json` and the Prometheus exposition (`/metrics`'s). Two engines on one GPU whose
targets cannot hold (a TTFT injected above each target) climb to the top of their bounds, report the target
unreachable (a line in each engine's log, the metric) and never change a weight more often than once per 10 s.
Tolerances hold on 2 loaded cores (an injected delay is a floor: a loaded host only adds to it)."""

from __future__ import annotations

import json
import os
import select
import threading
import time

import httpx
import pytest
from llama_env import read_join_line
from prometheus_client.parser import text_string_to_metric_families

from gpushare_tui.core.engines.llama_server import free_port
from gpushare_tui.core.observe.latency import LatencyReport
from gpushare_tui.core.pacing import control
from testkit.cli import cli_argv
from testkit.engines import engine_command
from testkit.wait import wait_for

pytestmark = pytest.mark.slow

SLACK_MS = 150  # what a loaded host may add to an injected delay
HELD_WATCH_S = 12.0  # an unreachable target's setting watched this long (> the governor's 10 s window): held
CHAT = {"messages": [{"role": "user", "content": "hi"}], "stream": True}


class Runs:
    """`gpushare-tui run` supervisors of one test, each joined and ready."""

    def __init__(self, procs, key: str, state_dir: str) -> None:
        self.procs, self.key = procs, key
        self.env = {**os.environ, "XDG_STATE_HOME": state_dir}
        self.sups: list = []

    def run(self, name: str, *options: str, engine: list[str]) -> int:
        """The engine's pid once it is ready (its supervisor joined)."""
        notice_r, notice_w = os.pipe2(os.O_CLOEXEC)
        argv = cli_argv("run", "--gpu-key", self.key, "--name", name, "--notify-fd", str(notice_w), *options)
        try:
            sup = self.procs.start([*argv, "--", *engine], pass_fds=(notice_w,), env=self.env)
            self.sups.append(sup)
        finally:
            os.close(notice_w)
        with os.fdopen(notice_r, "rb") as pipe:
            wait_for(lambda: read_join_line(sup), 60, what=f"{name}'s join line")
            assert select.select([pipe], [], [], 30)[0], "no ready notice"
            return int(json.loads(pipe.readline())["engine_pid"])

    def stop_all(self) -> str:
        """SIGTERM to each supervisor (it ends its engine); what they said on stderr after joining."""
        said = []
        for sup in self.sups:
            sup.terminate()
            said.append(sup.communicate(timeout=30)[1])
        return "".join(said)


@pytest.fixture
def runs(procs, gpu_key, runtime_dir, tmp_path):
    return Runs(procs, gpu_key, str(tmp_path))


def status(pid: int) -> control.StatusReply:
    return control.StatusReply.from_json(control.request(pid, "status"))


def openai_engine(port: int, *delays: str) -> list[str]:
    return engine_command("openai_engine", "--port", str(port), *delays)


def stream(client: httpx.Client, url: str, body: dict = CHAT) -> None:
    with client.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        for _ in r.iter_raw():
            pass


def test_a_proxied_vllm_preset_engine_shows_its_injected_delays_in_every_view(runs, cli, gpu_key) -> None:
    port = free_port()
    delays = ("--ttft-ms", "250", "--itl-ms", "40", "--tokens", "8", "--max-running", "4")
    pid = runs.run("chat", "--activity", "vllm", engine=openai_engine(port, *delays))
    url = f"http://127.0.0.1:{port}"
    with httpx.Client(timeout=30) as c:
        for _ in range(4):
            stream(c, f"{url}/v1/chat/completions")
        assert c.get(f"{url}/health").status_code == 200  # no work: not counted
        assert c.post(f"{url}/v1/nothing", json={}).status_code == 404
    wait_for(lambda: (status(pid).latency or LatencyReport()).status_4xx_total == 1, 10, what="the figures")
    lat = status(pid).latency
    assert lat is not None and lat.status_2xx_total == 4 and lat.requests == 4 and lat.in_flight == 0
    assert lat.ttft_p50_ms is not None and 250 <= lat.ttft_p50_ms * 1.01 <= 250 + SLACK_MS  # the sketch: within 1 %
    assert lat.itl_p50_ms is not None and 40 <= lat.itl_p50_ms * 1.01 <= 40 + SLACK_MS
    assert lat.e2e_p50_ms is not None and lat.e2e_p50_ms * 1.01 >= 250 + 7 * 40
    r = cli("status", "chat")
    assert r.returncode == 0 and "   latency: ttft p50 " in r.stdout and "2xx 4, 4xx 1" in r.stdout, r.stdout
    r = cli("--once", "--json", "--gpu-key", gpu_key)
    (peer,) = json.loads(r.stdout)["gpus"][0]["peers"]
    shown = peer["engine"]["latency"]
    assert shown["requests"] == 4 and shown["ttft_p50_ms"] * 1.01 >= 250 and shown["itl_p50_ms"] * 1.01 >= 40
    r = cli("--once", "--format", "prometheus", "--gpu-key", gpu_key)
    fams = {f.name: f for f in text_string_to_metric_families(r.stdout)}
    ttft = fams["gpushare_engine_time_to_first_token_seconds"]
    buckets = {s.labels["le"]: s.value for s in ttft.samples if s.name.endswith("_bucket")}
    assert buckets["0.1"] == 0 and buckets["+Inf"] == 4
    assert {s.labels["status"]: s.value for s in fams["gpushare_engine_requests"].samples}["4xx"] == 1
    assert fams["gpushare_engine_itl_p50_seconds"].samples[0].value >= 0.039
    said = runs.stop_all()
    assert "left the engine's process group" not in said, said  # its front proxy's process is ours, never paced


@pytest.mark.llama
def test_a_real_llama_server_behind_its_proxy_reports_its_latency(runs, llama_server, tiny_model, cli) -> None:
    port = free_port()
    pid = runs.run("tiny", engine=[llama_server, "-m", tiny_model, "--port", str(port), "-c", "256", "-t", "1"])
    body = {"prompt": "hello", "n_predict": 8, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=60) as c:
        for _ in range(3):
            stream(c, f"http://127.0.0.1:{port}/completion", body)
    wait_for(lambda: (status(pid).latency or LatencyReport()).status_2xx_total == 3, 10, what="the figures")
    lat = status(pid).latency
    assert lat is not None and lat.requests == 3 and lat.ttft_p50_ms is not None and lat.ttft_p50_ms > 0
    assert lat.itl_p50_ms is not None and lat.e2e_p99_ms is not None and lat.e2e_p99_ms >= lat.ttft_p50_ms
    r = cli("status", "tiny")
    assert r.returncode == 0 and "latency: ttft p50" in r.stdout


def test_two_targets_that_cannot_hold_are_reported_and_nothing_oscillates(runs, cli, gpu_key) -> None:
    """Each engine's TTFT is injected at 250 ms, its target 100 ms: no weight can meet it. Each climbs (2.5x the
    target: two rungs; or at once to the top, its requests in flight all the time pressing on any share below
    it), holds the top of its bounds and says the target is unreachable; the weights
    seen change at most once per 10 s, and not at all once unreachable (watched for more than a governor window
    after both are: HELD_WATCH_S)."""
    target = ("--slo-ttft-p99-ms", "100", "--slo-weight-max", "4")
    pids, urls = [], []
    for name in ("a", "b"):
        port = free_port()
        pids.append(runs.run(name, "--activity", "vllm", *target, engine=openai_engine(port, "--ttft-ms", "250",
                             "--itl-ms", "5", "--tokens", "2")))  # fmt: skip
        urls.append(f"http://127.0.0.1:{port}/v1/chat/completions")
    stop = threading.Event()

    def load(url: str) -> None:
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                stream(c, url)

    threads = [threading.Thread(target=load, args=(u,), daemon=True) for u in urls]
    for t in threads:
        t.start()
    seen: dict[int, list[tuple[float, str | None, float | None]]] = {pid: [] for pid in pids}
    unreachable_at: dict[int, float] = {}
    try:
        deadline = time.monotonic() + 75 + HELD_WATCH_S
        while time.monotonic() < deadline and not (
            len(unreachable_at) == 2 and time.monotonic() > max(unreachable_at.values()) + HELD_WATCH_S
        ):
            for pid in pids:
                st = status(pid)
                now = time.monotonic()
                if not seen[pid] or seen[pid][-1][1:] != (st.klass, st.weight):
                    seen[pid].append((now, st.klass, st.weight))
                if st.slo is not None and st.slo.state == "unreachable":
                    unreachable_at.setdefault(pid, now)
            time.sleep(0.3)
        assert len(unreachable_at) == 2, seen
        r = cli("--once", "--format", "prometheus", "--gpu-key", gpu_key)
        shown = json.loads(cli("--once", "--json", "--gpu-key", gpu_key).stdout)["gpus"][0]["peers"]
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    fams = {f.name: f for f in text_string_to_metric_families(r.stdout)}
    assert [s.value for s in fams["gpushare_engine_slo_unreachable"].samples] == [1, 1]
    assert fams["gpushare_gpu_slo_unreachable_engines"].samples[0].value == 2
    assert [p["engine"]["slo"]["state"] for p in shown] == ["unreachable", "unreachable"]
    for pid in pids:
        changes = seen[pid]
        assert changes[-1][1:] == ("interactive", 4.0), changes  # the top of its bounds, held
        times = [t for t, *_ in changes[1:]]
        assert all(b - a >= 9.0 for a, b in zip(times, times[1:])), changes  # polled: within a poll of 10 s
        assert all(t <= unreachable_at[pid] for t in times), changes  # nothing moves once unreachable
        log = open(status(pid).log or "").read()
        assert log.count("governor: target unreachable at the top of its bounds (interactive weight 4)") == 1, log
