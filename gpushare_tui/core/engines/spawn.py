"""The one way a gpushare-tui process starts another (`launch`, `up`'s children, `demo`), UI-free.

- `run_argv` / `synth_argv` / `serve_argv`: the `python -m gpushare_tui SUBCOMMAND ...` command
  lines, every option value written losslessly (a float by `repr`: the child parses the same number).
- `spawn`: the child in a session of its own, stdin from /dev/null, stdout and stderr to its log;
  with `parent_death`, it gets that signal when this process dies (`die_with_parent`, which the
  supervisor's own engine start uses too).
- The `--notify-fd` notice: `notify_ready` / `notify_failed` on the supervisor's side, one JSON
  line then the pipe closed; `read_notice` on the starter's side.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

from ..host import paths
from ..host.errors import EngineFinished, GpushareError
from .declaration import SourceOptions

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# A wait's progress callback (engines.health.wait_ready, launcher.launch_detached): called every poll
# with (what is waited for, seconds waited, seconds allowed, False), and once more with True when what
# was waited for is there (not on a failure: its error says so); the caller decides what to show.
Progress = Callable[[str, float, float, bool], None]
NOTICE_MAX_BYTES = 1024 * 1024  # a notice carries a log tail; a longer "line" is no notice


# -- command lines ---------------------------------------------------------------


def option_text(value: object) -> str:
    """An option's value on a command line: a float by `repr` (round-trips exactly), else `str`."""
    return repr(value) if isinstance(value, float) else str(value)


def gpushare_argv(subcommand: str, options: Mapping[str, object], tail: Sequence[str] = ()) -> list[str]:
    """`python -m gpushare_tui SUBCOMMAND --opt VALUE ... [-- TAIL...]` with this interpreter.

    `options` keys are option names without the dashes, `_` for `-` (`gpu_key`: `--gpu-key`), in
    order; a None or False value is left out, True is a bare flag."""
    argv = [sys.executable, "-m", "gpushare_tui", subcommand]
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, option_text(value)]
    return [*argv, "--", *tail] if tail else argv


def run_argv(
    engine_argv: Sequence[str],
    *,
    gpu_key: str,
    weight: float,
    name: str | None = None,
    load_timeout_s: float = 600.0,
    share_group: str | None = None,
    notify_fd: int | None = None,
    sources: SourceOptions = SourceOptions(),
    klass: str = "batch",
    proxy: bool = True,
    listen_fd: int | None = None,
    slo: Mapping[str, object] | None = None,
) -> list[str]:
    """`gpushare-tui run`: supervise `engine_argv`, with its ready notice on `notify_fd`; `sources`:
    its --activity/--health... options (those given); `--class` only when not the default batch,
    `--no-proxy` only when not `proxy`; `listen_fd`: its public port's listening socket (inherited)."""
    options = {"weight": weight, "gpu_key": gpu_key, "load_timeout": load_timeout_s, "notify_fd": notify_fd}
    options["listen_fd"] = listen_fd
    options |= {"name": name or None, "share_group": share_group, "class": _class_option(klass), **asdict(sources)}
    options["no_proxy"] = not proxy
    options |= slo or {}  # its latency target: declaration.SloDecl.run_options()
    return gpushare_argv("run", options, engine_argv)


def _class_option(klass: str) -> str | None:
    """The `--class` value to pass: None for the default (batch), so default command lines stay as they were."""
    return None if klass == "batch" else klass


def synth_argv(
    *,
    gpu_key: str,
    weight: float,
    name: str,
    share_group: str | None = None,
    step_ms: float | None = None,
    work_units: int | None = None,
    busy_idle: str | None = None,
    klass: str = "batch",
) -> list[str]:
    """`gpushare-tui synth --quiet`; `work_units` (not None: written, 0 too) instead of step_ms's work."""
    options = {"weight": weight, "gpu_key": gpu_key, "name": name, "share_group": share_group, "step_ms": step_ms}
    options |= {"work_units": work_units, "busy_idle": busy_idle, "class": _class_option(klass)}
    return gpushare_argv("synth", {**options, "quiet": True})


def serve_argv(listen: str) -> list[str]:
    """`gpushare-tui serve --listen HOST:PORT`."""
    return gpushare_argv("serve", {"listen": listen})


# -- starting ----------------------------------------------------------------------


def die_with_parent(sig: signal.Signals) -> Callable[[], None]:
    """A `preexec_fn`: the child gets `sig` when the process forking it dies, even by SIGKILL
    (Linux PR_SET_PDEATHSIG: it follows the forking *thread*, so fork from one that lasts), and
    exits at once if that process died before the prctl took effect."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: no dlopen after the fork
    parent = os.getpid()

    def setup() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return setup


def adopt_orphans() -> bool:
    """Make this process a child subreaper (Linux PR_SET_CHILD_SUBREAPER): a descendant whose parent
    exits (a double fork) is re-parented to us, not to init, so it stays in sight; we reap it. False
    where the kernel refuses."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def spawn(
    argv: Sequence[str],
    log: str | int,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
    parent_death: signal.Signals | None = None,
) -> subprocess.Popen:
    """Start `argv` in a new session, stdin /dev/null, stdout and stderr appended to `log` (a path
    in a trusted directory, opened by `paths.open_log`: never through a link; or an fd of ours,
    left open); with `parent_death`, that signal reaches it when this process dies. OSError if it
    cannot start, UntrustedPathError if the log may not be written."""
    fd = paths.open_log(log) if isinstance(log, str) else log
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            env=env,
            cwd=cwd,
            pass_fds=tuple(pass_fds),
            start_new_session=True,
            preexec_fn=die_with_parent(parent_death) if parent_death is not None else None,
        )
    finally:
        if isinstance(log, str):
            os.close(fd)


# -- the --notify-fd notice ---------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """The engine is healthy and joined."""

    engine_pid: int
    port: int | None  # None: a command whose port is not known
    host: str
    log: str
    slot: int | None
    supervisor_pid: int


@dataclass(frozen=True)
class Failed:
    """The engine could not be started: the reason, and its log's last lines. `finished`: it exited with code 0
    before it was ready (host.errors.EngineFinished): it ran and ended well, which is no failure."""

    error: str
    log_tail: str = ""
    finished: bool = False


class NoticeError(GpushareError):
    """What came on the notify pipe is not a notice."""


def _notify(fd: int | None, msg: dict) -> None:
    if fd is None:
        return
    try:
        os.write(fd, (json.dumps(msg) + "\n").encode())
        os.close(fd)
    except OSError:
        pass  # the starter went away: the supervisor carries on regardless


def notify_ready(fd: int | None, *, engine_pid: int, port: int | None, host: str, log: str, slot: int | None) -> None:
    """Supervisor side: the engine is healthy and joined (written once, then `fd` is closed)."""
    _notify(fd, {"ok": True, **asdict(Ready(engine_pid, port, host, log, slot, os.getpid()))})


def notify_failed(fd: int | None, error: GpushareError) -> None:
    """Supervisor side: the engine could not be started (its log's tail travels with the reason)."""
    _notify(fd, {"ok": False, **asdict(Failed(str(error), error.log_tail, isinstance(error, EngineFinished)))})


def read_notice(fd: int) -> Ready | Failed | None:
    """Starter side, once `fd` (the pipe's read end) is readable: the notice, or None when the pipe
    closed without one (the supervisor is gone: its exit status says why). NoticeError if what
    came is not a notice. Blocks until the line is complete (it is written at once)."""
    data = b""
    while not data.endswith(b"\n") and len(data) < NOTICE_MAX_BYTES:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    if not data.strip():
        return None
    try:
        msg = json.loads(data)
        if not isinstance(msg, dict):
            raise TypeError("not an object")
        if not msg.get("ok"):
            return Failed(str(msg.get("error")), str(msg.get("log_tail") or ""), msg.get("finished") is True)
        slot = msg.get("slot")
        return Ready(
            engine_pid=_int(msg["engine_pid"]),
            port=None if msg["port"] is None else _int(msg["port"]),
            host=str(msg["host"]),
            log=str(msg["log"]),
            slot=slot if isinstance(slot, int) and not isinstance(slot, bool) else None,
            supervisor_pid=_int(msg["supervisor_pid"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise NoticeError(f"bad notice on the notify pipe ({type(e).__name__}: {e})") from None


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not an integer: {value!r}")
    return value
