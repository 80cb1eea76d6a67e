"""core/engines/launcher.py: the detached supervisor's command line and the notice it answers on."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpushare_tui.core.engines import launcher
from gpushare_tui.core.engines.launcher import LaunchReply, LaunchSpec, launch_detached
from gpushare_tui.core.host.errors import EngineError, GpushareError, UsageError
from testkit.cli import cli_argv
from testkit.wait import wait_for

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


# -- Ctrl+C during `gpushare-tui launch` ----------------------------------------------------

LOADING_ENGINE = str(Path(__file__).parent / "data" / "loading_engine.py")


@pytest.mark.slow
def test_ctrl_c_while_the_engine_loads_stops_what_launch_started(
    procs, gpu_key: str, runtime_dir: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGINT to launch's process group (what a terminal's Ctrl+C does) while the engine is still
    loading: the detached supervisor and its engine are stopped, one line, exit 130."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    (model := tmp_path / "x.gguf").write_bytes(b"GGUF")
    argv = cli_argv(
        "launch", "--gpu-key", gpu_key, "--activity", "llama", "--", sys.executable, LOADING_ENGINE, "-m", str(model)
    )
    # its own process group, as a shell's foreground job; SIGINT ignored, as a job started with `&` by a
    # shell without job control inherits it: launch stops what it started on a Ctrl+C sent all the same
    p = procs.start(argv, start_new_session=True, preexec_fn=_ignore_sigint)
    started: list[psutil.Process] = []
    try:
        engine = wait_for(lambda: _engine_of(p.pid), 30, what="the loading engine")
        started = psutil.Process(p.pid).children(recursive=True)
        assert p.poll() is None  # still waiting for the engine to be healthy
        os.killpg(p.pid, signal.SIGINT)
        code = p.wait(timeout=30)
        err = p.stderr.read()
        assert code == 130, err
        (line,) = [ln for ln in err.splitlines() if ln.strip()]
        assert re.fullmatch(r"gpushare-tui: interrupted: supervisor \d+ and its engine stopped", line), err
        gone, alive = psutil.wait_procs(started, timeout=5)
        assert alive == [] and engine.pid in {g.pid for g in gone}
    finally:
        for child in started:  # by pid, the engine too: a supervisor killed outright leaves it running
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    child.send_signal(sig)
                except psutil.Error:
                    break


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _engine_of(launch_pid: int) -> psutil.Process | None:
    """The loading engine itself (the script this interpreter runs), not the supervisor whose
    command line names it too (nor the supervisor forked but not yet exec'd: launch's own line)."""
    try:
        for child in psutil.Process(launch_pid).children(recursive=True):
            if child.cmdline()[1:2] == [LOADING_ENGINE]:
                return child
    except psutil.Error:
        pass
    return None


@pytest.mark.slow
def test_a_synthetic_engine_is_launched_detached_and_ready_once_it_serves(gpu_key, runtime_dir, tmp_path, monkeypatch):
    """The synth path: a real `gpushare-tui synth` in a session of its own, `started` told at once,
    the reply once it has joined; one that exits first is an EngineError with its log's tail."""
    from gpushare_tui.core.engines.declaration import SynthDecl
    from gpushare_tui.core.pacing import control

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    told: list[tuple[int, str]] = []
    spec = LaunchSpec((), gpu_key, 2.0, name="det", synth=SynthDecl(2.0, 0))
    reply = launch_detached(spec, started=lambda pid, log: told.append((pid, log)))
    try:
        assert told == [(reply.engine_pid, reply.log)] and reply.supervisor_pid == reply.engine_pid
        assert reply.log.startswith(str(tmp_path / "gpushare-tui" / "synth-det-"))
        assert os.getsid(reply.engine_pid) == reply.engine_pid  # detached: its own session
        st = control.StatusReply.from_json(control.request(reply.engine_pid, "status"))
        assert (st.name, st.weight, st.gpu_key, st.slot) == ("det", 2.0, gpu_key, reply.slot)
        assert reply.summary().startswith(f"synthetic engine pid {reply.engine_pid} (slot {reply.slot})")
    finally:
        control.request(reply.engine_pid, "stop")
    wait_for(lambda: not psutil.pid_exists(reply.engine_pid), 15, what="the synthetic engine gone")
    with pytest.raises(EngineError, match=r"^synthetic engine exited \(code 2\) before it joined$") as e:
        launch_detached(LaunchSpec((), "bad key!", 1.0, synth=SynthDecl()))
    assert "invalid gpu key 'bad key!'" in e.value.log_tail
