"""When a started engine is ready (declaration.HealthSpec): `http` (GET its URL answers 200; 503
while loading), `tcp` (its port accepts a connection), `log` (a line of its log matches a regex,
the log read incrementally and bounded), `none` (at once). `wait_ready` is the one wait: an engine
that exits meanwhile, or is not ready in time, is an EngineError carrying its log's tail."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from ..host.budgets import HEALTH_LOG_READ_MAX_BYTES, HEALTH_PROBE_DEADLINE_S, HEALTH_PROBE_MAX_BYTES
from ..host.errors import EngineError, EngineFinished, Interrupted
from ..host.logtail import LogError, LogFollower, tail_text
from .declaration import HealthSpec
from .spawn import Progress

POLL_S = 0.1
TCP_CONNECT_S = 0.5
HOST_DEFAULT = "127.0.0.1"


class LogReady:
    """Whether a line appended to the log since this was made matches `regex` (read incrementally:
    at most HEALTH_LOG_READ_MAX_BYTES per poll). Make it before the engine starts: what it writes
    at once is then read too, and an old run's lines in the same log never count."""

    def __init__(self, log_path: str, regex: str) -> None:
        self._regex = re.compile(regex)
        self._follower = LogFollower(log_path, 0, max_read_bytes=HEALTH_LOG_READ_MAX_BYTES)

    def __call__(self) -> bool:
        try:
            lines = self._follower.poll().lines
        except LogError:
            return False
        return any(self._regex.search(line) for line in lines)

    def close(self) -> None:
        self._follower.close()


def _http_ready(url: str) -> Callable[[], bool]:
    from ..host import probe

    client = probe.new_client(HEALTH_PROBE_DEADLINE_S)

    def ready() -> bool:
        try:
            status, _ = probe.get(client, url, deadline_s=HEALTH_PROBE_DEADLINE_S, max_bytes=HEALTH_PROBE_MAX_BYTES)
        except probe.ProbeError:
            return False
        return status == 200

    ready.close = client.close  # type: ignore[attr-defined]
    return ready


def _tcp_ready(host: str, port: int) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            with socket.create_connection((host, port), timeout=TCP_CONNECT_S):
                return True
        except OSError:
            return False

    return ready


def ready_check(spec: HealthSpec, *, log_ready: LogReady | None = None) -> Callable[[], bool]:
    """The check `spec` declares (a complete spec: http with its URL; log with `log_ready`, made
    before the engine started)."""
    if spec.kind == "http":
        assert spec.url is not None
        return _http_ready(spec.url)
    if spec.kind == "tcp":
        assert spec.port is not None
        return _tcp_ready(HOST_DEFAULT, spec.port)
    if spec.kind == "log":
        assert log_ready is not None
        return log_ready
    return lambda: True


def wait_ready(
    proc: subprocess.Popen,
    ready: Callable[[], bool],
    log_path: str,
    timeout_s: float,
    *,
    what: str = "ready",
    quit_event: threading.Event | None = None,
    progress: Progress | None = None,
    waiting_for: str = "the engine",
    owned: Callable[[], bool] | None = None,
) -> None:
    """Poll `ready()` every POLL_S until true. EngineError (with the log's tail) if the engine exits
    first or is not ready after `timeout_s`; Interrupted if `quit_event` is set meanwhile. `progress`
    (spawn.Progress) is called before every poll with `waiting_for` and the time waited, and once ready.
    `owned`: asked once `ready()` is true, whether what answered is the engine's (listener.PortCheck.ready:
    False while nobody listens, an EngineError when another process does); not ready until it is."""
    started = time.monotonic()
    deadline = started + timeout_s
    unowned = False
    try:
        while True:
            if progress is not None:
                progress(waiting_for, time.monotonic() - started, timeout_s, False)
            code = proc.poll()
            if code == 0:
                raise EngineFinished(
                    f"engine {proc.pid} finished with exit code 0 before it was ready: it ran unpaced (it never"
                    " joined the share)",
                    tail_text(log_path),
                )
            if code is not None:
                raise EngineError(f"engine exited with code {code} while loading", tail_text(log_path))
            answered = ready()
            if answered and owned is not None and not owned():
                unowned, answered = True, False  # an answer, but no socket of the engine's listens there
            if answered:
                if proc.poll() is None:
                    if progress is not None:
                        progress(waiting_for, time.monotonic() - started, timeout_s, True)
                    return
                continue  # it answered, then exited: the exit is what to say
            if time.monotonic() > deadline:
                why = " (its port answered, but no socket of the engine's process tree listens there)"
                why = why if unowned else ""
                raise EngineError(f"engine not {what} after {timeout_s:.0f} s{why}", tail_text(log_path))
            if quit_event is not None:
                if quit_event.wait(POLL_S):
                    raise Interrupted("interrupted while the engine was loading")
            else:
                time.sleep(POLL_S)
    finally:
        close = getattr(ready, "close", None)
        if close is not None:
            close()


def waiting_for(spec: HealthSpec, program: str) -> str:
    """What a person is told is waited for: `llama-server /health on 127.0.0.1:8080`, ..."""
    engine = os.path.basename(program)
    if spec.kind == "http":
        url = urlsplit(spec.url or "")
        return f"{engine} {url.path or '/'} on {url.netloc}"
    if spec.kind == "tcp":
        return f"{engine} to accept connections on port {spec.port}"
    if spec.kind == "log":
        return f"{engine}'s log to match {spec.log_regex!r}"
    return engine


def describe(spec: HealthSpec) -> str:
    """How a person names what is waited for: `healthy` (http), `accepting on port N`, ..."""
    if spec.kind == "http":
        return "healthy"
    if spec.kind == "tcp":
        return f"accepting connections on port {spec.port}"
    if spec.kind == "log":
        return f"ready (no log line matched {spec.log_regex!r})"
    return "ready"
