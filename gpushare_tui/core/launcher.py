"""Detached launch of a supervised engine (`gpushare-tui launch`, the dashboard's launch form).

`launch_detached` starts `gpushare-tui run --notify-fd FD ... -- ENGINE ARGS` in a session
of its own (it outlives the caller) and waits on a pipe for the supervisor's one-line JSON
notice: `notify_ready` once the engine is healthy and joined, `notify_failed` when it could
not be started. The pipe closing without a notice means the supervisor died first.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from .errors import EngineError, GpushareError, UsageError
from .paths import state_dir

POLL_S = 0.1  # how often a wait for the notice checks `cancelled`
EXIT_WAIT_S = 2.0


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
class LaunchReply:
    """A launched engine, healthy and joined; its supervisor runs on in its own session."""

    engine_pid: int
    port: int
    host: str
    log: str
    slot: int | None
    supervisor_pid: int
    supervisor_log: str

    def to_json(self) -> dict:
        return {"ok": True, **asdict(self)}

    def summary(self) -> str:
        """Three lines for a person."""
        return (
            f"engine pid {self.engine_pid} port {self.port} (slot {self.slot})\n"
            f"engine log {self.log}\nsupervisor pid {self.supervisor_pid} log {self.supervisor_log}"
        )


def supervisor_argv(spec: LaunchSpec, notify_fd: int) -> list[str]:
    """The `gpushare-tui run` command line that supervises `spec`, reporting on `notify_fd`."""
    argv = [sys.executable, "-m", "gpushare_tui", "run", "--weight", repr(spec.weight), "--gpu-key", spec.gpu_key]
    argv += ["--load-timeout", str(spec.load_timeout_s), "--notify-fd", str(notify_fd)]
    if spec.name:
        argv += ["--name", spec.name]
    if spec.share_group:
        argv += ["--share-group", spec.share_group]
    return [*argv, "--", *spec.engine_argv]


def launch_detached(spec: LaunchSpec, *, cancelled: Callable[[], bool] = lambda: False) -> LaunchReply:
    """Start the supervisor of `spec` detached and wait until the engine is healthy or failed.

    UsageError without an engine command; ControlError if the state directory (logs) is
    unusable; EngineError with the engine log's tail when the engine could not be started.
    If `cancelled()` turns true meanwhile, the wait ends (GpushareError) and the launch goes
    on unobserved."""
    if not spec.engine_argv:
        raise UsageError("no engine command given (use: -- llama-server ARGS...)")
    sup_log = os.path.join(state_dir(), f"supervisor-{int(time.time())}-{os.getpid()}.log")
    read_fd, write_fd = os.pipe()
    try:
        with open(sup_log, "ab") as log:
            proc = subprocess.Popen(
                supervisor_argv(spec, write_fd),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(write_fd,),
                start_new_session=True,
            )
    except OSError as e:
        os.close(read_fd)
        raise GpushareError(f"cannot start the supervisor: {e.strerror or e}") from None
    finally:
        os.close(write_fd)  # ours: EOF on the pipe then means the supervisor is gone
    with os.fdopen(read_fd, "rb") as pipe:
        while not select.select([pipe], [], [], POLL_S)[0]:
            if cancelled():
                _reap_later(proc)
                raise GpushareError(f"stopped waiting: supervisor {proc.pid} goes on (log {sup_log})")
        line = pipe.readline()
    try:
        msg = json.loads(line)
        if not isinstance(msg, dict):
            raise ValueError
    except ValueError:
        try:
            proc.wait(EXIT_WAIT_S)  # the pipe closed as it exited: its exit code is due
        except subprocess.TimeoutExpired:
            _reap_later(proc)
        raise GpushareError(
            f"supervisor exited (code {proc.returncode}) before the engine was ready; see {sup_log}"
        ) from None
    _reap_later(proc)
    if not msg.get("ok"):
        raise EngineError(str(msg.get("error")), str(msg.get("log_tail") or ""))
    try:
        return LaunchReply(
            engine_pid=int(msg["engine_pid"]),
            port=int(msg["port"]),
            host=str(msg["host"]),
            log=str(msg["log"]),
            slot=msg["slot"] if isinstance(msg.get("slot"), int) else None,
            supervisor_pid=int(msg["supervisor_pid"]),
            supervisor_log=sup_log,
        )
    except (KeyError, TypeError, ValueError):
        raise GpushareError(f"supervisor {proc.pid} sent a bad notice; see {sup_log}") from None


def _reap_later(proc: subprocess.Popen) -> None:
    """The supervisor stays our child until it exits: reap it then, or a long-lived caller
    (the dashboard) keeps a zombie per launch."""
    threading.Thread(target=proc.wait, name="gpushare-reap", daemon=True).start()


def _notify(fd: int | None, msg: dict) -> None:
    if fd is None:
        return
    try:
        os.write(fd, (json.dumps(msg) + "\n").encode())
        os.close(fd)
    except OSError:
        pass  # the launcher went away: the supervisor carries on regardless


def notify_ready(fd: int | None, *, engine_pid: int, port: int, host: str, log: str, slot: int | None) -> None:
    """Supervisor side: the engine is healthy and joined (written once, then `fd` is closed)."""
    _notify(
        fd,
        {
            "ok": True,
            "engine_pid": engine_pid,
            "port": port,
            "host": host,
            "log": log,
            "slot": slot,
            "supervisor_pid": os.getpid(),
        },
    )


def notify_failed(fd: int | None, error: GpushareError) -> None:
    """Supervisor side: the engine could not be started (its log's tail travels with the reason)."""
    _notify(fd, {"ok": False, "error": str(error), "log_tail": error.log_tail})
