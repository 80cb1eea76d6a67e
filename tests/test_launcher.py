"""core/launcher.py: the detached supervisor's command line and the notice it answers on."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from gpushare_tui.core import launcher
from gpushare_tui.core.errors import EngineError, GpushareError, UsageError
from gpushare_tui.core.launcher import LaunchReply, LaunchSpec, launch_detached

SPEC = LaunchSpec(("llama-server", "-m", "x.gguf"), "k", 0.5, name="big", share_group="grp")


def _fake_supervisor(
    monkeypatch, procs, tmp_path, notice: dict | None, spawned: list[list[str]], then: str = "time.sleep(30)"
) -> None:
    """Popen that starts a stand-in supervisor: it writes `notice` (if any) on the notify fd, then
    runs `then` (by default it lingers)."""

    def popen(argv: list[str], **kw: object):
        spawned.append(argv)
        fd = argv[argv.index("--notify-fd") + 1]
        say = f"os.write({fd}, {json.dumps(json.dumps(notice) + chr(10))}.encode()); " if notice else ""
        code = f"import os, sys, time; {say}{then}"
        p = real_popen([sys.executable, "-c", code], pass_fds=kw["pass_fds"])
        procs.started.append(p)  # killed at teardown
        return p

    real_popen = subprocess.Popen  # the patch below replaces it for everyone
    monkeypatch.setattr(launcher.subprocess, "Popen", popen)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))


def test_ready_notice_is_the_reply(monkeypatch, procs, tmp_path) -> None:
    spawned: list[list[str]] = []
    notice = {"ok": True, "engine_pid": 41, "port": 8081, "host": "127.0.0.1", "log": "/e.log", "slot": 2}
    _fake_supervisor(monkeypatch, procs, tmp_path, {**notice, "supervisor_pid": 40}, spawned)
    reply = launch_detached(SPEC)
    assert reply == LaunchReply(41, 8081, "127.0.0.1", "/e.log", 2, 40, reply.supervisor_log)
    assert reply.supervisor_log.startswith(str(tmp_path / "gpushare-tui" / "supervisor-"))
    assert reply.to_json() == {"ok": True, **notice, "supervisor_pid": 40, "supervisor_log": reply.supervisor_log}
    assert len(spawned) == 1 and spawned[0][3:5] == ["run", "--weight"]


def test_a_bad_notice_is_one_line(monkeypatch, procs, tmp_path) -> None:
    _fake_supervisor(monkeypatch, procs, tmp_path, {"ok": True, "engine_pid": "41"}, [])
    with pytest.raises(GpushareError, match=r"^supervisor \d+ sent a bad notice; see .*supervisor-"):
        launch_detached(SPEC)


def test_a_supervisor_gone_without_a_notice_says_its_exit_code(monkeypatch, procs, tmp_path) -> None:
    _fake_supervisor(monkeypatch, procs, tmp_path, None, [], then="sys.exit(3)")
    with pytest.raises(GpushareError, match=r"^supervisor exited \(code 3\) before the engine was ready"):
        launch_detached(SPEC)


def test_failed_notice_is_an_engine_error_with_the_tail(monkeypatch, procs, tmp_path) -> None:
    _fake_supervisor(monkeypatch, procs, tmp_path, {"ok": False, "error": "engine exited", "log_tail": "bad"}, [])
    with pytest.raises(EngineError, match="^engine exited$") as e:
        launch_detached(SPEC)
    assert e.value.log_tail == "bad"


def test_cancelled_wait_ends_and_the_launch_goes_on(monkeypatch, procs, tmp_path) -> None:
    _fake_supervisor(monkeypatch, procs, tmp_path, None, [])  # holds the pipe open, says nothing
    t0 = time.monotonic()
    with pytest.raises(GpushareError, match="stopped waiting: supervisor"):
        launch_detached(SPEC, cancelled=lambda: time.monotonic() - t0 > 0.3)
    assert time.monotonic() - t0 < 5
    assert procs.started[0].poll() is None  # not ours to stop


def test_no_engine_command_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no engine command"):
        launch_detached(LaunchSpec((), "k"))
