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


def _named_semaphores(pid: int) -> set[str]:
    """The /dev/shm/sem.* files a process has mapped (a named POSIX semaphore it opened)."""
    with open(f"/proc/{pid}/maps") as f:
        return {line.split(maxsplit=5)[-1].strip() for line in f if "/dev/shm/sem." in line}


@pytest.mark.parametrize(
    "argv",
    [("multiproc_engine", "--workers", "2", "--work-cpu-s", "0.2"), ("http_engine", "--load-s", "0", "--workers", "2")],
    ids=["multiproc_engine", "http_engine"],
)
def test_engines_hold_no_named_semaphore_that_a_group_kill_would_leave_in_dev_shm(procs: Procs, argv) -> None:
    # a supervisor ends an engine's whole process group by SIGKILL: multiprocessing's resource tracker, which
    # would unlink the named semaphores of its Events and queues, dies with it and they stay in /dev/shm
    # (70 sem.mp-* files after one run of the suite). The engines talk to their workers over pipes instead.
    module, *args = argv
    if module == "http_engine":
        args = [*args, "--port", str(free_port())]
    p = procs.start(engine_command(module, *args), start_new_session=True, **ELSEWHERE)
    line = p.stdout.readline().split()  # type: ignore[union-attr]
    workers = [int(w) for w in line[line.index("workers") + 1 :]]
    if module == "multiproc_engine":
        assert p.stdout.readline().startswith("idle")  # type: ignore[union-attr]
    tree = [p.pid, *workers]
    assert {pid: _named_semaphores(pid) for pid in tree} == {pid: set() for pid in tree}
    os.killpg(p.pid, 9)
    p.wait(10)
