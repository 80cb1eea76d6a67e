"""The supervisor's lifetime and trust against a hostile host (issue 26 items 5, 9, 10), real processes
throughout: a real llama-server, connections that exhaust the supervisor's fds, a squatter of another uid
on the engine's port, a descendant that leaves the engine's process group."""

from __future__ import annotations

import resource
import socket
import threading
import time

import httpx
import pytest
from llama_env import Engines

from testkit.wait import wait_for

pytestmark = pytest.mark.llama

SUPERVISOR_NOFILE = 160  # the supervisor's fd limit in the EMFILE test (and its engine's: inherited)


@pytest.fixture
def engines(procs, gpu_key, llama_server, tiny_model, runtime_dir):  # noqa: F811
    e = Engines(procs, gpu_key, llama_server, tiny_model)
    yield e
    e.end()


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (SUPERVISOR_NOFILE, SUPERVISOR_NOFILE))


class Lines:
    """A supervisor's stderr lines, read on a thread as they come."""

    def __init__(self, sup) -> None:
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(iter(sup.stderr.readline, "")), daemon=True).start()

    def wait(self, *parts: str, timeout_s: float = 15) -> str:
        def found() -> str | None:
            return next((ln for ln in list(self.lines) if all(p in ln for p in parts)), None)

        return wait_for(found, timeout_s, 0.05, f"a line with {parts}")


def _port_of(lines: Lines) -> int:
    line = lines.wait("serving ", "through the front proxy")
    return int(line.split("serving ", 1)[1].split()[0].rsplit(":", 1)[1])


def _complete(port: int) -> int:
    body = {"prompt": "the a of", "n_predict": 64, "ignore_eos": True, "cache_prompt": False}
    return httpx.post(f"http://127.0.0.1:{port}/completion", json=body, timeout=60).status_code


def test_the_monitor_survives_emfile_and_active_rises_again(engines) -> None:
    """Issue 26 item 5: more idle connections than the supervisor's fd limit make its monitor's /proc reads
    fail with EMFILE. It says so in one line, pacing goes on, and once the fds are back `active` rises with
    the next request (on main the monitor thread died: `active` never rose again)."""
    sup, pid, _ = engines.run(1, popen={"preexec_fn": _low_nofile})
    lines = Lines(sup)
    port = _port_of(lines)
    assert _complete(port) == 200
    wait_for(lambda: engines.slot_of(pid).active, 10, what="active after the first request")
    wait_for(lambda: not engines.slot_of(pid).active, 15, what="idle again")
    held = []
    try:
        for _ in range(SUPERVISOR_NOFILE + 40):
            c = socket.create_connection(("127.0.0.1", port), timeout=5)
            held.append(c)
        time.sleep(3.0)  # the monitor's probes and /proc reads meet EMFILE meanwhile
        assert sup.poll() is None
    finally:
        for c in held:
            c.close()
    lines.wait("monitor: ", "Too many open files", "pacing goes on")

    def served() -> bool:
        try:
            return _complete(port) == 200
        except httpx.HTTPError:
            return False

    wait_for(served, 20, 0.2, "a request served once the fds are back")
    wait_for(lambda: engines.slot_of(pid).active, 10, 0.05, "active raised again")
    lines.wait("monitor: readings resumed")
    assert sum("monitor: " in ln for ln in lines.lines) == 2, lines.lines  # one line each way, not one per tick
    assert sup.poll() is None
