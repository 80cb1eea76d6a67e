"""Detached launch of a supervised engine (`gpushare-tui launch`, the dashboard's launch form).

`launch_detached` starts `gpushare-tui run --notify-fd FD ... -- ENGINE ARGS` in a session
of its own (it outlives the caller) and waits on a pipe for the supervisor's one-line notice
(core/spawn.py: `notify_ready` once the engine is healthy and joined, `notify_failed` when it
could not be started). The pipe closing without a notice means the supervisor died first.
A Ctrl+C (KeyboardInterrupt) during that wait stops what was started: the supervisor gets
SIGTERM and ends its engine (LaunchInterrupted).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from . import spawn
from .errors import EngineError, GpushareError, UsageError
from .paths import state_dir

POLL_S = 0.1  # how often a wait for the notice checks `cancelled`
EXIT_WAIT_S = 2.0
# after a Ctrl+C: the supervisor ends its engine (SIGTERM, then SIGKILL after its STOP_GRACE_S) and exits
INTERRUPT_STOP_WAIT_S = 15.0


class LaunchInterrupted(GpushareError):
    """The launch was interrupted (Ctrl+C) and what it started was stopped; exit 130."""


@dataclass(frozen=True)
class LaunchSpec:
    """A supervised engine to start: `engine_argv` is its command line (llama-server ARGS...)."""

    engine_argv: tuple[str, ...]
    gpu_key: str
    weight: float = 1.0
    name: str | None = None  # None: the model file's stem
    load_timeout_s: float = 600.0
    share_group: str | None = None


@dataclass(frozen=True)
class LaunchReply(spawn.Ready):
    """A launched engine, healthy and joined (the supervisor's notice); its supervisor runs on in
    its own session, writing `supervisor_log`."""

    supervisor_log: str

    def to_json(self) -> dict:
        return {"ok": True, **asdict(self)}

    def summary(self) -> str:
        """Three lines for a person."""
        return (
            f"engine pid {self.engine_pid} port {self.port} (slot {self.slot})\n"
            f"engine log {self.log}\nsupervisor pid {self.supervisor_pid} log {self.supervisor_log}"
        )


def launch_detached(
    spec: LaunchSpec, *, cancelled: Callable[[], bool] = lambda: False, progress: spawn.Progress | None = None
) -> LaunchReply:
    """Start the supervisor of `spec` detached and wait until the engine is healthy or failed.

    UsageError without an engine command; ControlError if the state directory (logs) is
    unusable; EngineError with the engine log's tail when the engine could not be started.
    If `cancelled()` turns true meanwhile, the wait ends (GpushareError) and the launch goes
    on unobserved. `progress` (spawn.Progress) is called every POLL_S of the wait with the load
    timeout as the time allowed, and once the engine is ready; it prints, not this."""
    if not spec.engine_argv:
        raise UsageError("no engine command given (use: -- llama-server ARGS...)")
    sup_log = os.path.join(state_dir(), f"supervisor-{int(time.time())}-{os.getpid()}.log")
    read_fd, write_fd = os.pipe()
    argv = spawn.run_argv(
        spec.engine_argv,
        gpu_key=spec.gpu_key,
        weight=spec.weight,
        name=spec.name,
        load_timeout_s=spec.load_timeout_s,
        share_group=spec.share_group,
        notify_fd=write_fd,
    )
    try:
        proc = spawn.spawn(argv, sup_log, pass_fds=(write_fd,))
    except OSError as e:
        os.close(read_fd)
        raise GpushareError(f"cannot start the supervisor: {e.strerror or e}") from None
    except GpushareError:  # its log may not be written (paths.open_log)
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # ours: EOF on the pipe then means the supervisor is gone
    what = f"{os.path.basename(spec.engine_argv[0])} to load and join (supervisor {proc.pid})"
    started = time.monotonic()
    try:
        while not select.select([read_fd], [], [], POLL_S)[0]:
            if progress is not None:
                progress(what, time.monotonic() - started, spec.load_timeout_s, False)
            if cancelled():
                _reap_later(proc)
                raise GpushareError(f"stopped waiting: supervisor {proc.pid} goes on (log {sup_log})")
        notice = spawn.read_notice(read_fd)
    except KeyboardInterrupt:
        raise LaunchInterrupted(_stop_supervisor(proc, sup_log)) from None
    except spawn.NoticeError:
        _reap_later(proc)
        raise GpushareError(f"supervisor {proc.pid} sent a bad notice; see {sup_log}") from None
    finally:
        os.close(read_fd)
    if notice is None:
        try:
            proc.wait(EXIT_WAIT_S)  # the pipe closed as it exited: its exit code is due
        except subprocess.TimeoutExpired:
            _reap_later(proc)
        raise GpushareError(f"supervisor exited (code {proc.returncode}) before the engine was ready; see {sup_log}")
    _reap_later(proc)
    if isinstance(notice, spawn.Failed):
        raise EngineError(notice.error, notice.log_tail)
    if progress is not None:
        progress(what, time.monotonic() - started, spec.load_timeout_s, True)
    return LaunchReply(**asdict(notice), supervisor_log=sup_log)


def _stop_supervisor(proc: subprocess.Popen, sup_log: str) -> str:
    """SIGTERM the supervisor (it ends its engine in order) and wait for it; one line saying so."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(INTERRUPT_STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        _reap_later(proc)
        waited = f"{INTERRUPT_STOP_WAIT_S:g} s"
        return f"interrupted: supervisor {proc.pid} told to stop, still ending after {waited} (log {sup_log})"
    except KeyboardInterrupt:  # a second Ctrl+C: it has been told already; don't wait
        _reap_later(proc)
        return f"interrupted: supervisor {proc.pid} told to stop (log {sup_log})"
    return f"interrupted: supervisor {proc.pid} and its engine stopped"


def _reap_later(proc: subprocess.Popen) -> None:
    """The supervisor stays our child until it exits: reap it then, or a long-lived caller
    (the dashboard) keeps a zombie per launch."""
    threading.Thread(target=proc.wait, name="gpushare-reap", daemon=True).start()
