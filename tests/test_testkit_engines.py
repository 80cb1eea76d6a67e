"""The stand-in engines of issue 19 (testkit/engines/) behave as their docstrings say: real processes."""

from __future__ import annotations

import os
import threading
import time

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpushare_tui.core.engines.llama_server import free_port
from testkit.engines import engine_command
from testkit.engines.http_engine import DEFAULT_GAUGE, HttpLoad
from testkit.procs import Procs
from testkit.wait import wait_for

pytestmark = pytest.mark.slow

# engine_command runs from any cwd, with no PYTHONPATH of the caller's (a supervisor runs it as given)
ELSEWHERE = {"cwd": "/", "env": {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}}


def _gauge(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return next(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


def _health(port: int) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code
    except httpx.HTTPError:
        return None


def test_http_engine_loads_then_serves_work_in_a_worker_with_an_in_flight_gauge(procs: Procs) -> None:
    port = free_port()
    p = procs.start(engine_command("http_engine", "--port", str(port), "--load-s", "3"), **ELSEWHERE)
    wait_for(lambda: _health(port) == 503, 30, what="/health 503 while loading")
    ready = p.stdout.readline().split()  # type: ignore[union-attr]
    assert ready[:3] == ["ready", str(port), "workers"]
    assert _health(port) == 200
    workers = [int(w) for w in ready[3:]]
    assert [c.pid for c in psutil.Process(p.pid).children()] != [] and set(workers) <= {
        c.pid for c in psutil.Process(p.pid).children()
    }
    busy = threading.Thread(target=lambda: httpx.post(f"http://127.0.0.1:{port}/work?units=1000", timeout=120))
    busy.start()
    wait_for(lambda: _gauge(port, DEFAULT_GAUGE) == 1, 30, what="the in-flight gauge at 1")
    worker_cpu_s = psutil.Process(workers[0]).cpu_times().user
    busy.join()
    assert _gauge(port, DEFAULT_GAUGE) == 0
    assert _gauge(port, "engine_work_units_total") == 1000
    assert psutil.Process(workers[0]).cpu_times().user > worker_cpu_s  # the work ran in the worker
    load = HttpLoad(port, units=5).start()
    wait_for(lambda: len(load.done) >= 3, 30, what="three requests of the load")
    load.stop()
    assert load.errors == 0
    p.terminate()
    assert p.wait(10) == 0
    wait_for(lambda: not any(psutil.pid_exists(w) for w in workers), 10, what="the workers gone")


def test_multiproc_engine_workers_are_children_that_work_then_idle(procs: Procs) -> None:
    p = procs.start(engine_command("multiproc_engine", "--workers", "2", "--work-cpu-s", "0.5"), **ELSEWHERE)
    line = p.stdout.readline().split()  # type: ignore[union-attr]
    assert line[0] == "workers" and len(line) == 3
    workers = [int(w) for w in line[1:]]
    assert {c.pid for c in psutil.Process(p.pid).children()} >= set(workers)
    assert all(os.getpgid(w) == os.getpgid(p.pid) for w in workers)  # one process group: signalled together
    idle = p.stdout.readline().split()  # type: ignore[union-attr]
    assert idle[0] == "idle" and abs(float(idle[1]) - time.time()) < 5
    assert all(psutil.Process(w).cpu_times().user >= 0.4 for w in workers)
    procs.kill(p)  # SIGKILL of the parent: the workers die with it (no orphan burning a core)
    wait_for(lambda: not any(psutil.pid_exists(w) for w in workers), 10, what="the workers gone")
