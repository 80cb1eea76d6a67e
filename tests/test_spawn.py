"""core/engines/spawn.py: the one way gpushare-tui starts its own processes: command lines (numbers
written losslessly), the child's session and log, death with the parent, the --notify-fd notice."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading

import pytest

from gpushare_tui.core.engines import spawn
from gpushare_tui.core.engines.declaration import SourceOptions
from gpushare_tui.core.host.errors import GpushareError
from gpushare_tui.core.pacing import control
from gpushare_tui.core.registry.abi import to_f32
from testkit.wait import wait_for

PY = [sys.executable, "-m", "gpushare_tui"]


def test_run_argv() -> None:
    argv = spawn.run_argv(
        ("llama-server", "-m", "x.gguf"), gpu_key="k", weight=0.5, name="big", share_group="grp", notify_fd=7
    )
    assert argv == [
        *PY, "run", "--weight", "0.5", "--gpu-key", "k", "--load-timeout", "600.0", "--notify-fd", "7",
        "--name", "big", "--share-group", "grp", "--", "llama-server", "-m", "x.gguf",
    ]  # fmt: skip
    bare = spawn.run_argv(("llama-server",), gpu_key="k", weight=1.0, name="", load_timeout_s=30.0)
    assert bare == [*PY, "run", "--weight", "1.0", "--gpu-key", "k", "--load-timeout", "30.0", "--", "llama-server"]
    sources = SourceOptions(activity="vllm", cpu_cores=0.5, health_port=8000, no_health=False)
    argv = spawn.run_argv(("vllm", "serve", "m"), gpu_key="k", weight=1.0, sources=sources)
    assert argv[4:] == [
        "--weight", "1.0", "--gpu-key", "k", "--load-timeout", "600.0", "--activity", "vllm", "--cpu-cores", "0.5",
        "--health-port", "8000", "--", "vllm", "serve", "m",
    ]  # fmt: skip
    assert spawn.run_argv(("e",), gpu_key="k", weight=1.0, klass="batch") == spawn.run_argv(
        ("e",), gpu_key="k", weight=1.0
    )
    chat = spawn.run_argv(("e",), gpu_key="k", weight=1.0, klass="interactive")
    assert chat[-4:] == ["--class", "interactive", "--", "e"]  # the default (batch) is not written
    synth = spawn.synth_argv(gpu_key="k", weight=1.0, name="s", klass="interactive")
    assert synth[-3:] == ["--class", "interactive", "--quiet"]


def test_synth_and_serve_argv() -> None:
    argv = spawn.synth_argv(gpu_key="k", weight=2.0, name="chat", step_ms=5.0, work_units=None, busy_idle=None)
    assert argv == [*PY, "synth", "--weight", "2.0", "--gpu-key", "k", "--name", "chat", "--step-ms", "5.0", "--quiet"]
    calibrated = spawn.synth_argv(gpu_key="k", weight=2.0, name="chat", work_units=0)  # 0: calibrate, written
    assert calibrated[-3:] == ["--work-units", "0", "--quiet"]
    argv = spawn.synth_argv(gpu_key="k", weight=1, name="a", share_group="g", work_units=12, busy_idle="25:10")
    assert argv[4:] == [
        "--weight", "1", "--gpu-key", "k", "--name", "a", "--share-group", "g", "--work-units", "12",
        "--busy-idle", "25:10", "--quiet",
    ]  # fmt: skip
    assert spawn.serve_argv("127.0.0.1:0") == [*PY, "serve", "--listen", "127.0.0.1:0"]


@pytest.mark.parametrize("value", [1.2345678, 0.1, 1 / 3, 1e-7, 123456789.123456789, 2.0])
def test_numbers_round_trip_exactly(value: float) -> None:
    argv = spawn.synth_argv(gpu_key="k", weight=value, name="n", step_ms=value)
    assert float(argv[argv.index("--weight") + 1]) == value
    assert float(argv[argv.index("--step-ms") + 1]) == value


def test_a_spawned_synth_runs_with_the_exact_weight(procs, gpu_key, runtime_dir, tmp_path) -> None:
    log = str(tmp_path / "synth.log")
    p = spawn.spawn(spawn.synth_argv(gpu_key=gpu_key, weight=1.2345678, name="exact", step_ms=1.0), log)
    procs.started.append(p)
    wait_for(lambda: control.is_managed(p.pid), 30, what="the synth's control socket")
    st = control.StatusReply.from_json(control.request(p.pid, "status"))
    assert st.weight == to_f32(1.2345678) != to_f32(1.23457)  # the slot's f32 of it; `:g` wrote 1.23457
    assert st.log == log  # stdout and stderr go to the log
    assert os.getsid(p.pid) == p.pid  # a session of its own


def test_the_child_dies_with_its_parent(procs, tmp_path) -> None:
    """The middle process (a stand-in for `up` or the demo) spawns a child with parent_death=SIGTERM
    and is SIGKILLed: the kernel sends the child SIGTERM."""
    marker = tmp_path / "got-sigterm"
    child = textwrap.dedent(f"""
        import signal, sys, time
        def term(*_):
            open({str(marker)!r}, "w").write("TERM")
            sys.exit(0)
        signal.signal(signal.SIGTERM, term)
        print("armed", flush=True)
        time.sleep(60)
    """)
    middle = textwrap.dedent(f"""
        import signal, sys, time
        from gpushare_tui.core.engines.spawn import spawn
        p = spawn([sys.executable, "-c", {child!r}], {str(tmp_path / "child.log")!r}, parent_death=signal.SIGTERM)
        print(p.pid, flush=True)
        time.sleep(60)
    """)
    m = procs.start([sys.executable, "-c", middle])
    grandchild = int(m.stdout.readline())
    try:
        wait_for(lambda: "armed" in (tmp_path / "child.log").read_text(), 30, what="the child's handler")
        m.kill()
        wait_for(marker.exists, 10, what="SIGTERM in the child after its parent's SIGKILL")
        wait_for(lambda: not _running(grandchild), 10, what="the child's exit")
    finally:
        if _running(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pipe_with(writer) -> int:
    r, w = os.pipe()
    writer(w)  # closes `w`
    return r


def test_ready_notice_round_trip() -> None:
    r = _pipe_with(lambda w: spawn.notify_ready(w, engine_pid=41, port=8081, host="::1", log="/e.log", slot=2))
    try:
        assert spawn.read_notice(r) == spawn.Ready(41, 8081, "::1", "/e.log", 2, os.getpid())
    finally:
        os.close(r)


def test_failed_notice_round_trip_with_a_long_log_tail() -> None:
    tail = "\n".join(f"line {i} " + "x" * 100 for i in range(1500))  # > one pipe buffer (64 KiB)
    error = GpushareError("engine exited with code 1 while loading")
    error.log_tail = tail
    r, w = os.pipe()
    t = threading.Thread(target=spawn.notify_failed, args=(w, error))
    t.start()  # the write blocks until the reader has read most of it
    try:
        assert spawn.read_notice(r) == spawn.Failed("engine exited with code 1 while loading", tail)
    finally:
        t.join()
        os.close(r)


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", None),  # closed without a notice: the supervisor is gone
        (b"not json\n", spawn.NoticeError),
        (b"[1, 2]\n", spawn.NoticeError),
        (b'{"ok": true, "engine_pid": 4}\n', spawn.NoticeError),  # fields missing
        (  # a pid that is not an integer
            b'{"ok": true, "engine_pid": "4", "port": 1, "host": "h", "log": "l", "supervisor_pid": 3}\n',
            spawn.NoticeError,
        ),
        (
            b'{"ok": true, "engine_pid": 4, "port": 1, "host": "h", "log": "l", "slot": "x", "supervisor_pid": 3}\n',
            spawn.Ready(4, 1, "h", "l", None, 3),
        ),
        (b'{"ok": false}\n', spawn.Failed("None", "")),
    ],
)
def test_what_is_not_a_notice(data: bytes, expected) -> None:
    def write(w: int) -> None:
        os.write(w, data)
        os.close(w)

    r = _pipe_with(write)
    try:
        if isinstance(expected, type):
            with pytest.raises(expected, match="bad notice"):
                spawn.read_notice(r)
        else:
            assert spawn.read_notice(r) == expected
    finally:
        os.close(r)
