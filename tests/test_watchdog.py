"""core/engines/watchdog.py: the process that continues an engine's whole group when its supervisor dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from llama_env import proc_state

from gpushare_tui.core.engines import watchdog
from testkit.wait import wait_for

pytestmark = pytest.mark.slow

GROUP = "import os,time\nif os.fork()==0:\n    time.sleep(60)\ntime.sleep(60)"


@pytest.fixture
def group():
    p = subprocess.Popen([sys.executable, "-c", GROUP], process_group=0)
    child = wait_for(lambda: _children(p.pid), 10, what="the group's child")[0]
    yield p, child
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
    p.wait()


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


def test_end_of_file_continues_then_ends_the_whole_group(group) -> None:
    p, child = group
    wd = watchdog.start(p.pid, 5.0)
    assert os.getsid(wd.pid) == wd.pid  # a session of its own: a terminal's Ctrl+C never reaches it
    os.killpg(p.pid, signal.SIGSTOP)
    wait_for(lambda: proc_state(p.pid) == proc_state(child) == "T", 5, what="the group stopped")
    time.sleep(0.2)
    assert wd.proc.poll() is None  # blocked on the pipe, not polling: it does nothing until the supervisor goes
    wd.close(end_tree=True)  # what the supervisor's death does: its end of the pipe closes
    assert wd.proc.returncode == 0
    assert p.wait(5) == -signal.SIGTERM  # continued, then SIGTERM: in order
    assert proc_state(child) in (None, "Z")


IGNORES_TERM = (
    "import signal,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ignoring', flush=True)\ntime.sleep(60)"
)
ESCAPES = "import os,time\nif os.fork()==0:\n    os.setsid()\n    time.sleep(60)\ntime.sleep(60)"


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace(procs) -> None:
    p = procs.start([sys.executable, "-c", IGNORES_TERM], process_group=0)
    assert p.stdout.readline() == "ignoring\n"  # its handler is set (a fixed sleep was not enough on a loaded box)
    wd = watchdog.start(p.pid, grace_s=0.5)
    os.killpg(p.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    wd.close(end_tree=True)
    assert p.wait(5) == -signal.SIGKILL
    assert 0.4 < time.monotonic() - t0 < 4.0


def test_a_tracked_descendant_outside_the_group_is_ended_too(procs) -> None:
    p = procs.start([sys.executable, "-c", ESCAPES], process_group=0)
    escaped = wait_for(lambda: _children(p.pid), 10, what="the escaped child")[0]
    wait_for(lambda: os.getsid(escaped) == escaped, 5, what="its setsid")
    try:
        wd = watchdog.start(p.pid, 5.0)
        wd.track(escaped)
        wd.track(escaped)  # once is enough
        os.kill(escaped, signal.SIGSTOP)
        wd.close(end_tree=True)
        assert p.wait(5) == -signal.SIGTERM
        wait_for(lambda: proc_state(escaped) in (None, "Z"), 5, what="the escaped child's end")
    finally:
        if proc_state(escaped) not in (None, "Z"):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                os.kill(escaped, sig)


def test_an_orderly_close_leaves_the_group_alone(group) -> None:
    p, child = group
    wd = watchdog.start(p.pid, 5.0)
    os.killpg(p.pid, signal.SIGSTOP)
    wait_for(lambda: proc_state(child) == "T", 5, what="the group stopped")
    wd.close()
    assert wd.proc.returncode == 0 and proc_state(child) == "T"  # told to quit: no signal
    os.killpg(p.pid, signal.SIGCONT)


def test_a_supervisor_killed_while_its_engine_loads_leaves_no_engine(procs, gpu_key, runtime_dir, tmp_path) -> None:
    """`run` SIGKILLed (no cleanup of its own runs) while the engine loads: the watchdog ends the engine."""
    import psutil

    from testkit.cli import cli_argv

    loading = os.path.join(os.path.dirname(__file__), "data", "loading_engine.py")
    argv = cli_argv("run", "--weight", "1", "--gpu-key", gpu_key, "--activity", "llama", "--", sys.executable, loading)
    sup = procs.start([*argv, "-m", "x.gguf"], env={**os.environ, "XDG_STATE_HOME": str(tmp_path)})

    def engine() -> psutil.Process | None:
        kids = psutil.Process(sup.pid).children()
        return next((k for k in kids if k.cmdline()[1:2] == [loading]), None)

    eng = wait_for(engine, 30, what="the loading engine")
    try:
        sup.kill()
        sup.wait(10)
        assert eng.wait(15) is not None or not eng.is_running()
    finally:
        if eng.is_running():
            eng.kill()
