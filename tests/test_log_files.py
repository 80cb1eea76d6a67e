"""Engine logs over many runs (core/host/logfiles.py): each run's start is marked with its time (`logs NAME`
shows the runs apart), a long log is moved aside when a run starts on it, and the one-file-per-run logs of one
engine name are collected beyond budgets.LOG_FILES_PER_NAME_MAX (never one a process still has open)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
from up_env import UpProc, write

from gpushare_tui.core.host import budgets, logfiles
from gpushare_tui.core.host.paths import UntrustedPathError
from testkit.cli import cli_argv, run_cli

MARK = re.compile(r"--- gpushare-tui: (\S+) started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC( \(pid \d+\))? ---")

ONE = """\
gpu_key = "{key}"

[[engine]]
name = "batch"
weight = 1
synth = {{ step_ms = 2 }}
"""


@pytest.fixture
def state_home(tmp_path, monkeypatch) -> str:
    path = tmp_path / "state"
    path.mkdir()
    monkeypatch.setenv("XDG_STATE_HOME", str(path))
    return str(path / "gpushare-tui")


@pytest.mark.slow
def test_logs_shows_each_up_run_apart_with_its_start_time(procs, gpu_key, runtime_dir, state_home, tmp_path) -> None:
    """Two `up` runs of one file append to the engine's one log: `logs batch` shows each run's start, then its join."""
    path = write(tmp_path / "gpushare.toml", ONE.format(key=gpu_key))
    for run in (1, 2):
        up = UpProc(procs, path, gpu_key)
        try:
            up.slot("batch")
            up.wait_line("batch: ready")
            if run == 2:
                r = run_cli("logs", "batch", "-n", "100")
        finally:
            up.proc.send_signal(signal.SIGTERM)
            assert up.proc.wait(30) == 0, up.text()
            up.end()
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    marks = [i for i, line in enumerate(lines) if MARK.fullmatch(line)]
    assert len(marks) == 2 and marks[0] == 0, r.stdout
    assert all(MARK.fullmatch(lines[i]).group(1) == "batch" for i in marks)  # type: ignore[union-attr]
    assert "joined" in lines[marks[0] + 1] and "joined" in lines[marks[1] + 1], r.stdout


@pytest.mark.slow
def test_run_collects_its_names_older_logs_but_never_an_open_one(procs, gpu_key, runtime_dir, state_home) -> None:
    """12 old `chat-PID.log` files, one still open (a running process writes it): `run --name chat` keeps the
    newest LOG_FILES_PER_NAME_MAX of the name, the open one, and nothing of another name's or not a plain file."""
    os.makedirs(state_home, mode=0o700)
    old = [os.path.join(state_home, f"chat-{1000 + i}.log") for i in range(12)]
    for i, p in enumerate(old):
        with open(p, "w") as f:
            f.write(f"run {i}\n")
        os.utime(p, (1_000_000 + i, 1_000_000 + i))
    others = [os.path.join(state_home, n) for n in ("chat-big-5.log", "batch-7.log", "chat-9.log.1")]
    for p in others:
        open(p, "w").close()
        os.utime(p, (1, 1))
    link = os.path.join(state_home, "chat-77.log")
    os.symlink(others[0], link)
    os.utime(link, (1, 1), follow_symlinks=False)
    with open(old[0], "a") as held:  # the oldest, held open by a running process
        writer = procs.start(["sleep", "60"], stdout=held, stderr=subprocess.DEVNULL)
    try:
        r = subprocess.run(
            cli_argv("run", "--name", "chat", "--gpu-key", gpu_key, "--no-health", "--", "sh", "-c", "echo hello"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "Traceback" not in r.stderr, r.stderr
        names = sorted(
            n
            for n in os.listdir(state_home)
            if re.fullmatch(r"chat-[0-9]+\.log", n) and not os.path.islink(os.path.join(state_home, n))
        )
        mine = [n for n in names if n not in {os.path.basename(p) for p in old}]
        assert len(mine) == 1, names  # this run's
        new_log = open(os.path.join(state_home, mine[0])).read()
        assert MARK.match(new_log) and "pid" in new_log.splitlines()[0], new_log
        kept_old = {n for n in names if n != mine[0]}
        newest = {os.path.basename(p) for p in old[-(budgets.LOG_FILES_PER_NAME_MAX - 1) :]}
        assert kept_old == newest | {os.path.basename(old[0])}, names  # the newest, and the open one
        assert all(os.path.exists(p) for p in others) and os.path.islink(link)
    finally:
        writer.kill()
        writer.wait()


def test_a_long_log_is_moved_aside_when_a_run_starts_on_it(tmp_path) -> None:
    log = tmp_path / "up-x-batch.log"
    with open(log, "wb") as f:
        f.truncate(budgets.LOG_ROTATE_BYTES)  # sparse: as long, without writing it
    logfiles.begin_run(str(log), "batch", None, 1_800_000_000.0)
    assert os.path.getsize(str(log) + ".1") == budgets.LOG_ROTATE_BYTES
    assert log.read_text() == "--- gpushare-tui: batch started 2027-01-15 08:00:00 UTC ---\n"
    logfiles.begin_run(str(log), "batch", 42, 1_800_000_060.0)  # short: appended to
    assert log.read_text().splitlines()[1] == "--- gpushare-tui: batch started 2027-01-15 08:01:00 UTC (pid 42) ---"
    assert os.path.getsize(str(log) + ".1") == budgets.LOG_ROTATE_BYTES


def test_a_log_path_that_is_a_link_is_never_followed_nor_rotated(tmp_path) -> None:
    """A log name that is a symbolic link (planted where a log will be): refused with one line, its target untouched,
    nothing moved aside; and a family's collection never removes a link nor what it points to."""
    target = tmp_path / "precious"
    target.write_bytes(b"x" * 100)
    link = tmp_path / "chat-1.log"
    os.symlink(target, link)
    with pytest.raises(UntrustedPathError):
        logfiles.begin_run(str(link), "chat", 1, time.time())
    assert target.read_bytes() == b"x" * 100 and os.path.islink(link) and not os.path.exists(str(link) + ".1")
    for i in range(budgets.LOG_FILES_PER_NAME_MAX + 3):
        (tmp_path / f"chat-{100 + i}.log").write_text("")
    removed = logfiles.collect(str(tmp_path), logfiles.family("chat-"))
    assert len(removed) == 3 and os.path.islink(link) and target.exists()


def test_a_family_is_one_names_per_run_logs() -> None:
    chat = logfiles.family("chat-")
    assert chat.fullmatch("chat-123.log") and chat.fullmatch("chat-1700000000-55.log")
    assert not chat.fullmatch("chat-big-123.log") and not chat.fullmatch("chat-123.log.1")
    assert logfiles.surplus([("a", 3.0), ("b", 1.0), ("c", 2.0)], 2) == ["b"]
