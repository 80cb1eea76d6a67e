"""Activity and health sources (core/engines/activity/, core/engines/health.py) one unit at a time, and the one
resolution of an engine's options (declaration.resolve_sources)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from gpushare_tui.core.engines.activity import CpuMeter, ProcessTree, Tick, make_source
from gpushare_tui.core.engines.activity.cpu import CpuActivity
from gpushare_tui.core.engines.activity.metrics import GaugeActivity, gauge_value
from gpushare_tui.core.engines.declaration import (
    ActivitySpec,
    DeclarationError,
    HealthSpec,
    SourceOptions,
    command_kind,
    resolve_sources,
)
from gpushare_tui.core.engines.health import LogReady
from gpushare_tui.core.host import probe
from gpushare_tui.core.registry import abi
from testkit.http import BodyServer

S = 1_000_000


# -- resolution --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "options", "kind", "activity", "health"),
    [
        (["llama-server", "-m", "x.gguf"], {}, "llama-server", ActivitySpec("llama"), HealthSpec("http")),
        (["/opt/bin/llama-server"], {"activity": "cpu"}, "llama-server", ActivitySpec("cpu"), HealthSpec("http")),
        (["python", "x.py"], {}, "command", ActivitySpec("cpu"), HealthSpec("none")),
        (["python", "x.py"], {"activity": "llama"}, "llama-server", ActivitySpec("llama"), HealthSpec("http")),
        (
            ["vllm", "serve", "m"],
            {"activity": "vllm"},
            "vllm",
            ActivitySpec("metrics", "http://127.0.0.1:8000/metrics", "vllm:num_requests_running"),
            HealthSpec("http", url="http://127.0.0.1:8000/health"),
        ),
        (
            ["python", "-m", "sglang.launch_server", "--port", "31000"],
            {"activity": "sglang", "no_health": True},
            "sglang",
            ActivitySpec("metrics", "http://127.0.0.1:31000/metrics", "sglang:num_running_reqs"),
            HealthSpec("none"),
        ),
        (
            ["text-generation-launcher"],
            {"activity": "tgi", "gauge": "tgi_queue_size"},
            "tgi",
            ActivitySpec("metrics", "http://127.0.0.1:3000/metrics", "tgi_queue_size"),
            HealthSpec("http", url="http://127.0.0.1:3000/health"),
        ),
        (
            ["python", "serve.py"],
            {"metrics_url": "http://127.0.0.1:9/metrics", "gauge": "g", "health_port": 9},
            "command",
            ActivitySpec("metrics", "http://127.0.0.1:9/metrics", "g"),
            HealthSpec("tcp", port=9),
        ),
        (["train.sh"], {"activity": "always", "health_log": "ready"}, "command", ActivitySpec("always"),
         HealthSpec("log", log_regex="ready")),
        (["python", "x.py"], {"activity": "cpu", "cpu_cores": 1.5}, "command", ActivitySpec("cpu", cpu_cores=1.5),
         HealthSpec("none")),
    ],
)  # fmt: skip
def test_resolve_sources(command, options, kind, activity, health) -> None:
    r = resolve_sources(command, SourceOptions(**options))
    assert (r.kind, r.activity, r.health) == (kind, activity, health)


@pytest.mark.parametrize(
    ("options", "field", "text"),
    [
        ({"activity": "nope"}, "activity", "must be one of llama, metrics, cpu, gpu, always, vllm, sglang, tgi"),
        ({"activity": "metrics"}, "activity", "needs a metrics URL"),
        ({"activity": "metrics", "metrics_url": "http://h/metrics"}, "activity", "needs the gauge"),
        ({"activity": "always", "gauge": "g"}, "activity", "go with --activity metrics"),
        ({"activity": "always", "cpu_cores": 1.0}, "activity", "--cpu-cores goes with --activity cpu"),
        ({"cpu_cores": float("nan")}, "activity", "cpu_cores must be a number of cores > 0"),
        ({"health_port": 70000}, "health", "needs a TCP port"),
        ({"health_url": "x", "health_log": "y"}, "health", "give one of"),
        ({"health_url": "localhost:8000/health"}, "health", "http:// or https://"),
    ],
)
def test_resolve_sources_errors_are_one_line_on_their_field(options, field, text) -> None:
    with pytest.raises(DeclarationError) as e:
        resolve_sources(["python", "x.py"], SourceOptions(**options))
    assert e.value.field == field and text in str(e.value) and "\n" not in str(e.value)


def test_command_kind() -> None:
    assert command_kind(["/usr/local/bin/llama-server"]) == "llama-server"
    assert command_kind(["vllm", "serve"]) == "vllm"
    assert command_kind(["python3", "-m", "vllm.entrypoints.openai.api_server"]) == "vllm"
    assert command_kind(["python", "-m", "sglang.launch_server"]) == "sglang"
    assert command_kind(["text-generation-launcher", "--model-id", "m"]) == "tgi"
    assert command_kind(["python", "train.py"]) == command_kind(["torchrun", "x"]) == "command"


# -- the metrics source ---------------------------------------------------------------------------------

EXPOSITION = """# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 2.0
vllm:num_requests_running{model_name="b"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 7.0
"""


def test_gauge_value_sums_the_gauge_over_its_labels() -> None:
    assert gauge_value(EXPOSITION, "vllm:num_requests_running") == 3.0
    assert gauge_value(EXPOSITION, "vllm:num_requests_swapped") is None
    assert gauge_value("tgi_batch_current_size 0\n", "tgi_batch_current_size") == 0.0
    assert gauge_value("not prometheus {{{\n", "x") is None
    # only the gauge's own lines, whole-name matches, labels with quoted braces and escapes, a timestamp
    text = 'x_total 5\nx{a="}\\"{"} 2 1700000000\n# x 9\nx 1.5\n'
    assert gauge_value(text, "x") == 3.5 and gauge_value(text.encode(), "x") == 3.5
    assert gauge_value('x{a="1" 3\n', "x") is None and gauge_value("x\n", "x") is None  # a broken sample of it


@pytest.fixture
def server():
    s = BodyServer()
    yield s
    s.close()


def _tick(now_us: int, *, active: bool = False, running: bool = True, run_us: int | None = None) -> Tick:
    return Tick(now_us, now_us if run_us is None else run_us, running, active, lambda: running)


def test_gauge_source_follows_the_gauge(server) -> None:
    src = GaugeActivity(server.url, "vllm:num_requests_running", cpu_fraction=1.0)  # the ticks are made up: no back-off
    try:
        server.body = b"vllm:num_requests_running 0\n"
        src.poll(_tick(10 * S))
        assert not src.in_flight and src.last_us is None
        server.body = EXPOSITION.encode()
        src.poll(_tick(10 * S + 10_000))  # within the idle cadence: no probe
        assert not src.in_flight
        src.poll(_tick(10 * S + 60_000))
        assert src.in_flight and src.last_us is not None and src.is_active(src.last_us + abi.ACTIVITY_WINDOW_US)
        server.body = b"vllm:num_requests_running 0\n"
        src.poll(_tick(10 * S + 200_000, active=True))  # the active cadence (250 ms): not yet
        assert src.in_flight
        src.poll(_tick(10 * S + 320_000, active=True))
        assert not src.in_flight
        src.poll(_tick(11 * S, running=False))  # stopped: never probed, in flight as it was
        assert not src.in_flight
    finally:
        src.close()


def test_probe_reads_are_bounded(server) -> None:
    server.body = b"x" * 5000
    with probe.new_client() as client:
        assert probe.get(client, server.url)[1] == server.body
        with pytest.raises(probe.ProbeError, match="larger than 4096 bytes"):
            probe.get(client, server.url, max_bytes=4096)
        with pytest.raises(probe.ProbeError):
            probe.get(client, "http://127.0.0.1:1/metrics")


# -- the cpu source ---------------------------------------------------------------------------------------


class _ScriptedTree:
    """A test double for one unit (the source's logic): CPU seconds as the test sets them."""

    def __init__(self) -> None:
        self.cpu = 0.0

    def cpu_s(self) -> float:
        return self.cpu


def test_cpu_source_reads_cores_over_continued_time_only() -> None:
    tree = _ScriptedTree()
    src = CpuActivity(tree, cpu_cores=0.5)  # type: ignore[arg-type]
    src.poll(_tick(10 * S, run_us=0))
    tree.cpu = 0.09  # 0.9 cores over 100 ms of running
    src.poll(_tick(10 * S + 100_000, run_us=100_000))
    assert src.in_flight and src.last_us == 10 * S + 100_000
    # stopped for 300 ms (run_us does not move): no reading, still in flight (its work waits)
    src.poll(_tick(10 * S + 400_000, run_us=100_000, running=False))
    assert src.in_flight and src.last_us == 10 * S + 100_000
    tree.cpu = 0.10  # 0.1 core once continued: idle
    src.poll(_tick(10 * S + 500_000, run_us=200_000))
    assert not src.in_flight
    assert src.is_active(10 * S + 100_000 + abi.ACTIVITY_WINDOW_US)
    assert not src.is_active(10 * S + 100_001 + abi.ACTIVITY_WINDOW_US)


def test_always_source_is_always_working() -> None:
    src = make_source(ActivitySpec("always"), tree=None)  # type: ignore[arg-type]
    src.poll(_tick(5 * S))
    assert src.in_flight and src.is_active(5 * S)


@pytest.mark.slow
def test_process_tree_sums_the_cpu_of_every_descendant() -> None:
    code = "import os,time\nfor _ in range(2):\n    if os.fork()==0:\n        while True: pass\ntime.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], process_group=0)
    try:
        tree = ProcessTree(p.pid, refresh_s=0.0)
        deadline = time.monotonic() + 10
        while len(tree.pids()) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(tree.pids()) == 3
        time.sleep(0.5)
        kids = tree.pids()[1:]
        direct = [psutil.Process(pid).cpu_times() for pid in tree.pids()]
        summed = tree.cpu_s()
        assert sum(t.user + t.system for t in direct[1:]) > 0  # the children did run
        assert abs(summed - sum(t.user + t.system for t in direct)) <= 0.05, (summed, direct)
        meter = CpuMeter(tree)
        assert meter.cores(0) is None and meter.cores(10_000) is None  # shorter than its span: no reading
        assert (meter.cores(1_000_000) or 0.0) >= 0.0
        before = tree.cpu_s()
        for pid in kids:
            os.kill(pid, 9)
        time.sleep(0.1)
        assert tree.cpu_s() >= before  # a counter: the workers' time stays counted once they are gone
    finally:
        os.killpg(p.pid, 9)
        p.wait()


# -- the log health source ---------------------------------------------------------------------------------


def test_log_ready_reads_only_what_is_appended(tmp_path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("engine ready (an old run)\n")
    ready = LogReady(str(log), r"^engine ready\b")
    try:
        assert not ready()
        with open(log, "a") as f:
            f.write("loading...\nengine re")
            f.flush()
            assert not ready()  # a line is matched once it is complete
            f.write("ady on port 8000\n")
        assert ready()
    finally:
        ready.close()


def test_process_tree_cpu_is_read_to_the_microsecond() -> None:
    """The tree's CPU time comes from each process's CPU-time clock (one system call, ns), not /proc/PID/stat's
    10 ms ticks through psutil (~185 µs a read in the monitor, four a second): 2 ms of our own CPU reads as such."""
    tree = ProcessTree(os.getpid(), refresh_s=3600.0)
    tree.cpu_s()
    for _ in range(5):
        before, t0 = tree.cpu_s(), time.thread_time()
        while time.thread_time() - t0 < 0.002:
            pass
        spun = time.thread_time() - t0
        read = tree.cpu_s() - before
        if spun <= read <= spun + 0.004:  # our other threads may run meanwhile; a tick-counted read is 0 or 10 ms
            return
    raise AssertionError(f"read {read:.6f} s for {spun:.6f} s spun")
