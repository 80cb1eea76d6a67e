"""`gpushare-tui demo` leaves no process and no segment behind, however it ends."""

from __future__ import annotations

import fcntl
import glob
import os
import pty
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time

import psutil
import pytest

from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.registry.segment import Segment
from gpushare_tui.demo import DEMO_ENGINES, start_demo, stop_demo
from testkit.shm import shm_file, unique_key
from testkit.wait import wait_for

pytestmark = pytest.mark.slow


def peers(key: str) -> list:
    try:
        with Segment.attach_readonly(shm_file(key)) as seg:
            now = wall_us()
            return [r for r in seg.read_slots() if r.is_alive(now)]
    except Exception:
        return []


def _gone(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break


def _demo_logs(key: str) -> list[str]:
    return glob.glob(os.path.join(tempfile.gettempdir(), f"gpushare-demo-{key}-*"))


def test_start_and_stop_leave_nothing_behind(runtime_dir):
    key = unique_key("demo")
    demo = start_demo(key)
    pids = demo.pids
    assert demo.janitor is not None
    pids.append(demo.janitor.pid)
    try:
        assert len(_demo_logs(key)) == 3
        got = sorted((r.name, r.weight) for r in peers(key))
        assert got == sorted((n, w) for n, w, _ in DEMO_ENGINES)
        assert all(os.path.exists(os.path.join(runtime_dir, "gpushare-tui", f"{p}.sock")) for p in demo.pids)
    finally:
        stop_demo(demo)
        _kill(pids)
    assert all(p.poll() is not None for p in demo.procs)
    assert _gone(pids)
    assert not os.path.exists(shm_file(key))
    assert not any(os.path.exists(p) for p in demo.logs)
    assert _demo_logs(key) == []
    stop_demo(demo)  # idempotent


def test_an_engine_that_ends_while_the_demo_runs_is_reaped(runtime_dir):
    key = unique_key("demo")
    demo = start_demo(key)
    pids = demo.pids + [demo.janitor.pid]
    try:
        victim = demo.procs[1]
        victim.terminate()  # as `s` in the dashboard does, through the control socket
        # no one calls poll()/wait() here: the demo's reaper must, or it stays <defunct>
        wait_for(lambda: not psutil.pid_exists(victim.pid), 10, what="the ended engine reaped")
        assert all(p.poll() is None for p in demo.procs if p is not victim)
    finally:
        stop_demo(demo)
        _kill(pids)


class PtyDemo:
    """`gpushare-tui demo` on a pseudo-terminal (Textual needs one), output drained."""

    def __init__(self, key: str, cols: int = 100, rows: int = 30) -> None:
        self.key = key
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpushare_tui", "demo", "--gpu-key", key, "--interval", "0.5"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        os.close(slave)
        self.master = master
        self.output = bytearray()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.output += data

    def children(self) -> list[int]:
        """The demo's child processes: its engines and its janitor."""
        try:
            return [c.pid for c in psutil.Process(self.proc.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def engines(self) -> list[int]:
        return [p for p in self.children() if "synth" in _cmdline(p)]

    def wait_ready(self) -> list[int]:
        wait_for(lambda: len(peers(self.key)) == 3 or self.proc.poll() is not None, 30, what="3 demo engines")
        assert self.proc.poll() is None, bytes(self.output[-2000:]).decode(errors="replace")
        wait_for(lambda: b"chat" in self.output, 20, what="the dashboard drawing the demo engines")
        wait_for(lambda: len(self.children()) == 4, 10, what="3 engines and the janitor")
        assert len(self.engines()) == 3
        return self.children()

    def close(self) -> None:
        pids = self.children()
        if self.proc.poll() is None:
            _kill([self.proc.pid])
        _kill(pids)
        self.proc.wait(10)
        os.close(self.master)
        try:
            os.unlink(shm_file(self.key))
        except FileNotFoundError:
            pass


@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP", "ctrl-c", "q"])
def test_demo_command_cleans_up(runtime_dir, how):
    key = unique_key("demo")
    d = PtyDemo(key)
    kids: list[int] = []
    try:
        kids = d.wait_ready()
        if how.startswith("SIG"):
            d.proc.send_signal(getattr(signal, how))
        elif how == "ctrl-c":
            os.write(d.master, b"\x03")  # a raw-mode terminal sends Ctrl-C as a key
        else:
            os.write(d.master, b"q")
        assert d.proc.wait(15) == 0
        wait_for(lambda: _gone(kids), 10, what="demo engines gone")
        assert not os.path.exists(shm_file(key))
    finally:
        _kill(kids)
        d.close()


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def test_demo_engines_die_with_a_killed_demo(runtime_dir):
    key = unique_key("demo")
    d = PtyDemo(key)
    kids: list[int] = []
    try:
        kids = d.wait_ready()
        d.proc.send_signal(signal.SIGKILL)  # no cleanup code runs: PR_SET_PDEATHSIG ends the engines
        d.proc.wait(10)
        wait_for(lambda: _gone(kids), 10, what="orphaned demo engines to exit")
        time.sleep(0.1)
        assert peers(key) == []  # they left their slots on the way out
        # the janitor (one of `kids`, now gone too) removed the segment and the logs
        assert not os.path.exists(shm_file(key))
        assert _demo_logs(key) == []
    finally:
        _kill(kids)
        d.close()


@pytest.mark.parametrize("how", ["stop_demo", "janitor"])
def test_engines_launched_in_the_demo_end_with_it_even_through_the_janitor(runtime_dir, tmp_path, monkeypatch, how):
    """What the dashboard's form starts in the demo (Demo.adopt) ends with the demo: by stop_demo, and
    by the janitor once the demo is gone (EOF on its pipe), with its log and the segment removed."""
    from gpushare_tui.core.engines.declaration import SynthDecl
    from gpushare_tui.core.engines.launcher import LaunchSpec, launch_detached

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    key = unique_key("demo")
    demo = start_demo(key)
    pids = [*demo.pids, demo.janitor.pid]
    try:
        reply = launch_detached(LaunchSpec((), key, 1.0, name="extra", synth=SynthDecl(2.0, 0)), started=demo.adopt)
        pid = reply.engine_pid
        pids.append(pid)
        assert demo.launched == [(pid, reply.log)] and os.path.exists(reply.log)
        wait_for(lambda: pid in [r.pid for r in peers(key)], 10, what="the launched engine joined")
        if how == "janitor":  # as if the demo died: its end of the janitor's pipe closes
            demo.janitor.stdin.close()
            wait_for(lambda: _gone([pid]), 15, what="the janitor ending the launched engine")
            wait_for(lambda: not os.path.exists(shm_file(key)), 15, what="the janitor removing the segment")
        else:
            stop_demo(demo)
            assert _gone([pid]) and not os.path.exists(shm_file(key))
        wait_for(lambda: not os.path.exists(reply.log), 10, what="the launched engine's log removed")
    finally:
        stop_demo(demo)
        _kill(pids)
    assert _gone(pids)
