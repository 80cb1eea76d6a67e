"""`gpushare-tui logs PID [-f] [-n N]` against real engines: synthetic ones whose output goes to a
file (as under `demo` and `up`), and a real llama-server under `run`."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from llama_env import end_pid
from up_env import UpProc, write

from gpushare_tui.core.host.paths import up_log_path
from gpushare_tui.core.pacing.control import socket_path
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.registry.segment import Segment, shm_path
from gpushare_tui.demo import start_demo, stop_demo
from testkit.cli import cli_argv, run_cli
from testkit.shm import unique_key
from testkit.wait import wait_for

pytestmark = pytest.mark.slow

NO_LOG = "reports no log file (its output goes to a terminal or a pipe)"


def start_synth(procs, key: str, output) -> subprocess.Popen:
    """A synthetic engine whose stdout and stderr go to `output` (a file object, or PIPE)."""
    argv = cli_argv("synth", "--weight", "1", "--gpu-key", key, "--quiet", "--busy-idle", "0.1:0.9", "--step-ms", "1")
    p = procs.start(argv, stdout=output, stderr=output)
    wait_for(lambda: p.poll() is not None or os.path.exists(socket_path(p.pid)), 20, what="synth control socket")
    assert p.poll() is None, "synth exited"
    return p


@pytest.fixture
def engine(procs, gpu_key, runtime_dir, tmp_path):
    """(pid, log path) of a synthetic engine writing to a log file the test appends to too."""
    log = tmp_path / "engine.log"
    with open(log, "ab") as out:
        p = start_synth(procs, gpu_key, out)
    wait_for(lambda: "joined" in log.read_text(), 10, what="the engine's join line in its log")
    return p.pid, str(log)


def append(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


class Lines:
    """A follower process's stdout, line by line, read on a thread (reads never hang a test)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.q: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self.q.put(line.rstrip("\n"))

    def next(self, timeout_s: float = 10.0) -> str:
        try:
            return self.q.get(timeout=timeout_s)
        except queue.Empty:
            pytest.fail(f"no line within {timeout_s} s")

    def none_within(self, timeout_s: float) -> bool:
        try:
            self.q.get(timeout=timeout_s)
        except queue.Empty:
            return True
        return False


def test_logs_prints_the_last_lines(engine):
    pid, log = engine
    append(log, "".join(f"line {i}\n" for i in range(30)))
    r = run_cli("logs", str(pid))
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == [f"line {i}" for i in range(20, 30)]  # 10 by default, like tail
    for flag in ("-n", "--lines"):
        r = run_cli("logs", str(pid), flag, "3")
        assert (r.returncode, r.stdout, r.stderr) == (0, "line 27\nline 28\nline 29\n", "")
    r = run_cli("logs", str(pid), "-n", "0")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    r = run_cli("logs", str(pid), "-n", "1000")
    assert r.returncode == 0 and r.stdout.splitlines() == open(log).read().splitlines()
    assert "joined" in r.stdout.splitlines()[0]


def test_logs_never_sends_control_characters_to_the_terminal(engine):
    pid, log = engine
    append(log, "evil \x1b]2;OWNED\x07 \x1b[2J\x9b end\ntab\there\n")
    r = run_cli("logs", str(pid), "-n", "2")
    assert r.returncode == 0
    assert r.stdout == "evil \ufffd]2;OWNED\ufffd \ufffd[2J\ufffd end\ntab     here\n"


def _ctrl_c_default() -> None:
    """In the child: SIGINT's default action, as in a terminal. A test run started in the background
    (`cmd &` in a script) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_follow_prints_appended_lines_until_ctrl_c(engine, procs):
    pid, log = engine
    append(log, "a\nb\nc\n")
    f = procs.start(cli_argv("logs", str(pid), "-f", "-n", "2"), preexec_fn=_ctrl_c_default)
    out = Lines(f)
    assert [out.next(), out.next()] == ["b", "c"]
    for i in range(3):
        append(log, f"new {i}\n")
        assert out.next() == f"new {i}"
    append(log, "half a ")
    assert out.none_within(1.0)  # a line is shown once it ends
    append(log, "line\n")
    assert out.next() == "half a line"
    f.send_signal(signal.SIGINT)
    assert f.wait(10) == 0
    assert f.stderr.read() == ""  # quietly


def test_follow_goes_on_after_truncation(engine, procs):
    pid, log = engine
    append(log, "ready\n")
    f = procs.start(cli_argv("logs", str(pid), "--follow", "-n", "1"), preexec_fn=_ctrl_c_default)
    out = Lines(f)
    assert out.next() == "ready"  # following from here
    append(log, "before\n")
    assert out.next() == "before"
    with open(log, "w") as t:  # truncated (logrotate's copytruncate)
        t.write("after\n")
    assert out.next() == "after"
    f.send_signal(signal.SIGINT)
    assert f.wait(10) == 0
    assert f.stderr.read() == f"gpushare-tui: log {log} truncated: following it from its start\n"


def test_follow_ends_when_the_engine_exits(engine, procs):
    pid, log = engine
    append(log, "ready\n")
    f = procs.start(cli_argv("logs", str(pid), "-f", "-n", "1"))
    out = Lines(f)
    assert out.next() == "ready"  # following from here
    append(log, "last words\n")
    assert out.next() == "last words"
    append(log, "no newline")
    os.kill(pid, signal.SIGTERM)
    assert f.wait(15) == 0
    assert out.next() == "no newline"  # the unfinished line, shown at the end
    assert f.stderr.read() == f"gpushare-tui: engine {pid} exited\n"


def test_a_deleted_log_is_said_to_be_missing(engine):
    pid, log = engine
    os.unlink(log)  # the engine still writes to it
    for args in ([], ["-f"]):
        r = run_cli("logs", str(pid), *args)
        assert (r.returncode, r.stdout, r.stderr) == (
            1,
            "",
            f"gpushare-tui: engine {pid}: log file {log} does not exist\n",
        )


def test_an_engine_whose_output_is_no_file_has_no_log(procs, gpu_key, runtime_dir):
    p = start_synth(procs, gpu_key, subprocess.PIPE)
    for args in ([], ["-f"]):
        r = run_cli("logs", str(p.pid), *args)
        assert (r.returncode, r.stdout, r.stderr) == (1, "", f"gpushare-tui: engine {p.pid} {NO_LOG}\n")
    assert run_cli("status", str(p.pid), "--json").stdout.count('"log": null') == 1


def test_logs_of_what_is_no_managed_engine(runtime_dir, gpu_key, procs):
    r = run_cli("logs", "4000999")
    assert (r.returncode, r.stdout, r.stderr) == (1, "", "gpushare-tui: no process 4000999\n")
    sleeper = procs.start(["sleep", "30"])
    r = run_cli("logs", str(sleeper.pid), "-f")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (
        f"gpushare-tui: process {sleeper.pid} is not a gpushare-tui engine (no registry slot, no control socket)\n"
    )
    foreign = Membership(gpu_key, 1.0, "foreign", pid=sleeper.pid, log=lambda _m: None)  # a peer, no socket
    foreign.join()
    try:
        r = run_cli("logs", str(sleeper.pid))
        assert (r.returncode, r.stdout) == (1, "")
        assert (
            r.stderr
            == f"gpushare-tui: engine {sleeper.pid} is not managed by gpushare-tui (a foreign peer: read-only)\n"
        )
    finally:
        foreign.leave()


@pytest.mark.parametrize("value", ["-1", "x", "1.5", "", "--"])
def test_bad_line_counts_exit_2(value: str, engine):
    pid, _log = engine
    r = run_cli("logs", str(pid), "-n", value)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"gpushare-tui: invalid --lines {value!r}: an integer >= 0\n"


@pytest.mark.llama
def test_logs_of_a_real_llama_server_and_a_log_that_is_no_longer_readable(
    procs,
    gpu_key,
    runtime_dir,
    tmp_path,
    monkeypatch,
    llama_server,  # noqa: F811
    tiny_model,  # noqa: F811
):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # where `run` writes the engine's log
    argv = cli_argv("run", "--weight", "1", "--gpu-key", gpu_key, "--name", "tiny", "--")
    sup = procs.start([*argv, llama_server, "-m", tiny_model, "-t", "1", "-c", "512", "-np", "1"])
    wait_for(lambda: sup.poll() is not None or "joined" in sup.stderr.readline(), 120, what="supervisor join line")
    assert sup.poll() is None, sup.stderr.read()
    with Segment.attach_readonly(shm_path(gpu_key)) as seg:
        pid = next(r.pid for r in seg.read_slots() if r.name == "tiny")
    try:
        status = json.loads(run_cli("status", str(pid), "--json").stdout)
        log = status["log"]
        assert log.startswith(str(tmp_path / "state")) and os.path.isfile(log)
        r = run_cli("logs", str(pid), "-n", "1000")
        assert (r.returncode, r.stderr) == (0, "")
        assert r.stdout.splitlines() == open(log, errors="replace").read().splitlines()
        assert "llama_server: listening on http://127.0.0.1:" in r.stdout  # its own words, on its internal port
        r = run_cli("logs", str(pid), "-n", "2")
        assert r.stdout.splitlines() == open(log, errors="replace").read().splitlines()[-2:]

        def fails_with(message: str) -> None:
            for args in ([], ["-f"]):
                r = run_cli("logs", str(pid), *args, timeout=20)  # a FIFO must not block it
                assert (r.returncode, r.stdout, r.stderr) == (1, "", f"gpushare-tui: engine {pid}: {message}\n")

        moved = log + ".moved"
        os.rename(log, moved)
        fails_with(f"log file {log} does not exist")
        os.symlink(moved, log)
        fails_with(f"log {log} is a symbolic link (not followed)")
        os.unlink(log)
        os.mkfifo(log)
        fails_with(f"log {log} is not a regular file")
        os.unlink(log)
        state = os.path.dirname(log)
        shutil.move(state, state + ".moved")
        with open(state, "w"):  # the log's directory is now a file
            pass
        fails_with(f"cannot read log file {log}: Not a directory")
    finally:
        end_pid(pid)


ONE_SYNTH = """\
gpu_key = "{key}"

[[engine]]
name = "a"
weight = 1
synth = {{ step_ms = 2 }}
"""


def test_engines_under_up_and_demo_report_their_log_files(procs, gpu_key, runtime_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # up's engines' logs
    up = UpProc(procs, write(tmp_path / "gpushare.toml", ONE_SYNTH.format(key=gpu_key)), gpu_key)
    try:
        pid, _w = up.slot("a")
        log = Path(up_log_path(str(tmp_path / "state" / "gpushare-tui"), up.path, "a"))
        assert json.loads(run_cli("status", str(pid), "--json").stdout)["log"] == str(log)
        r = run_cli("logs", str(pid), "-n", "1000")
        assert (r.returncode, r.stderr) == (0, "")
        assert r.stdout.splitlines() == log.read_text().splitlines() and "joined" in r.stdout
    finally:
        up.end()
    demo = start_demo(unique_key("demo"))
    try:
        for p, path in zip(demo.procs, demo.logs):
            assert json.loads(run_cli("status", str(p.pid), "--json").stdout)["log"] == path
            r = run_cli("logs", str(p.pid), "-n", "1")
            assert (r.returncode, r.stderr) == (0, "") and "joined" in r.stdout
    finally:
        stop_demo(demo)


def test_a_reader_that_stops_reading_is_no_error(engine):
    """`logs PID | head -1`: the pipe closes early; no traceback, exit 0."""
    pid, log = engine
    append(log, "".join(f"line {i}\n" for i in range(50_000)))  # more than a pipe holds
    cmd = " ".join(cli_argv("logs", str(pid), "-n", "50000"))
    for extra in ("", " -f"):
        r = subprocess.run(
            ["bash", "-c", f"{cmd}{extra} | head -1; exit ${{PIPESTATUS[0]}}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (r.returncode, r.stdout, r.stderr) == (0, "line 0\n", ""), extra


def test_a_log_path_is_shown_printable(procs, gpu_key, runtime_dir, tmp_path):
    log = tmp_path / "evil\x1b]2;OWNED\x07.log"
    with open(log, "ab") as out:
        p = start_synth(procs, gpu_key, out)
    wait_for(lambda: "joined" in log.read_text(), 10, what="the engine's join line in its log")
    os.unlink(log)
    r = run_cli("logs", str(p.pid))
    shown = str(tmp_path / "evil\ufffd]2;OWNED\ufffd.log")
    assert (r.returncode, r.stdout, r.stderr) == (
        1,
        "",
        f"gpushare-tui: engine {p.pid}: log file {shown} does not exist\n",
    )
