"""`run` and `launch` say what they wait for while the model loads (cli/common.WaitProgress): on a terminal
a line every few seconds, elsewhere only one line once ready. Real CLI processes, an engine that loads for
READY_AFTER_S seconds (tests/data/loading_engine.py)."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpushare_tui.cli.common import PROGRESS_EVERY_S
from testkit.cli import cli_argv, run_cli

pytestmark = pytest.mark.slow

SLOW_ENGINE = str(Path(__file__).parent / "data" / "loading_engine.py")  # ready after READY_AFTER_S
READY_AFTER_S = PROGRESS_EVERY_S + 1.5  # one progress line, then ready


def _end_tree(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _read_until(fd: int, done: str, timeout_s: float) -> str:
    """What the terminal (pty master `fd`) shows until a line holds `done`."""
    out = b""
    deadline = time.monotonic() + timeout_s
    while done.encode() not in out:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            pytest.fail(f"no {done!r} within {timeout_s} s; the terminal showed {out!r}")
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        out += chunk
    return out.decode().replace("\r\n", "\n")


def _read_for(fd: int, seconds: float) -> str:
    out = b""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0 and select.select([fd], [], [], left)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out.decode().replace("\r\n", "\n")


def test_run_on_a_terminal_says_what_it_waits_for(procs, gpu_key: str, runtime_dir: str, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.setenv("READY_AFTER_S", str(READY_AFTER_S))
    master, slave = pty.openpty()
    (model := tmp_path / "x.gguf").write_bytes(b"GGUF")
    argv = cli_argv(
        "run", "--name", "slow", "--gpu-key", gpu_key, "--activity", "llama", "--", sys.executable, SLOW_ENGINE,
        "-m", str(model),
    )  # fmt: skip
    p = procs.start(argv, stderr=slave, stdout=slave)
    os.close(slave)
    children: list[int] = []
    try:
        shown = _read_until(master, "joined", READY_AFTER_S + 30)
        shown += _read_for(master, 1.0)  # a second join line would be here by now
        children = [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
        lines = [ln for ln in shown.splitlines() if ln.strip()]
        port = re.search(r"engine port (\d+)", shown)
        assert port, shown
        waiting = [ln for ln in lines if "waiting for" in ln]
        assert waiting and all(
            re.fullmatch(rf"gpushare-tui: waiting for \S+ /health on 127\.0\.0\.1:{port[1]} \(\d+ s of 600 s\)", ln)
            for ln in waiting
        ), shown
        assert int(waiting[0].split("(")[1].split(" s")[0]) >= PROGRESS_EVERY_S, shown  # not before
        ready = [ln for ln in lines if "ready after" in ln]
        assert len(ready) == 1 and re.fullmatch(
            rf"gpushare-tui: ready after [\d.]+ s \(waited for \S+ /health on 127\.0\.0\.1:{port[1]}\)", ready[0]
        ), shown
        assert float(ready[0].split("after ")[1].split(" s")[0]) >= READY_AFTER_S - 0.5
        assert len([ln for ln in lines if "joined" in ln]) == 1, shown  # once, not twice
        assert lines.index(ready[0]) < lines.index(next(ln for ln in lines if "joined" in ln)), shown
        p.send_signal(signal.SIGTERM)  # in order: its engine is stopped too
        p.wait(30)
        assert not any(psutil.pid_exists(pid) for pid in children), children
    finally:
        os.close(master)
        _end_tree(children)


def test_launch_off_a_terminal_says_only_when_ready(procs, gpu_key: str, runtime_dir: str, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.setenv("READY_AFTER_S", str(READY_AFTER_S))
    (model := tmp_path / "x.gguf").write_bytes(b"GGUF")
    argv = cli_argv(
        "launch",
        "--name",
        "slowl",
        "--gpu-key",
        gpu_key,
        "--activity",
        "llama",
        "--",
        sys.executable,
        SLOW_ENGINE,
        "-m",
        str(model),
    )
    p = procs.start(argv)
    started: list[int] = []
    try:
        out, err = p.communicate(timeout=READY_AFTER_S + 60)
        started = [int(x) for x in re.findall(r"(?:engine|supervisor) pid (\d+)", out)]
        assert p.returncode == 0, err
        (line,) = err.splitlines()  # stderr is a pipe: no progress lines, one when ready
        assert re.fullmatch(
            r"gpushare-tui: ready after [\d.]+ s \(waited for \S+ to load and join \(supervisor \d+\)\)", line
        )
        stopper = run_cli("stop", "slowl")  # by name
        assert (stopper.returncode, stopper.stdout) == (0, f"engine {started[0]}: stopped\n"), stopper.stderr
    finally:
        _end_tree(started)
