"""Detached launch of a supervised engine (`gpushare-tui launch`, the dashboard's launch form).

`launch_detached` starts `gpushare-tui run --notify-fd FD ... -- ENGINE ARGS` in a session
of its own (it outlives the caller) and waits on a pipe for the supervisor's one-line notice
(core/engines/spawn.py: `notify_ready` once the engine is healthy and joined, `notify_failed` when it
could not be started). The pipe closing without a notice means the supervisor died first.
A synthetic engine (`spec.synth`) is started as `gpushare-tui synth` instead, detached the same way;
it is ready once it has joined and serves its control socket.
A termination signal during that wait (`termination`: a lifecycle.Termination the caller's handlers
feed, the command line's SIGTERM/SIGINT/SIGHUP) stops what was started: the supervisor gets SIGTERM
and ends its engine (LaunchInterrupted). It is checked once the start returned too, so a signal
that comes while the supervisor is being started stops it as well.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from ..host import logfiles
from ..host.errors import EngineError, EngineFinished, GpushareError, Interrupted, UsageError
from ..host.lifecycle import Termination
from ..host.paths import file_name_part, state_dir
from ..host.text import printable
from . import spawn
from .declaration import EngineDecl, SloDecl, SourceOptions, SynthDecl

POLL_S = 0.1  # how often a wait for the notice checks `cancelled`
EXIT_WAIT_S = 2.0
# after a Ctrl+C: the supervisor ends its engine (SIGTERM, then SIGKILL after its STOP_GRACE_S) and exits
INTERRUPT_STOP_WAIT_S = 15.0
SYNTH_READY_TIMEOUT_S = 60.0  # a synthetic engine calibrates (well under 1 s), joins, binds its socket
SYNTH_NAME = "synth"  # a synthetic engine's name when the spec gives none
SYNTH_WHAT = "synthetic engine"


class LaunchInterrupted(Interrupted):
    """The launch was interrupted (a termination signal) and what it started was stopped; exit 128 + signum."""


@dataclass(frozen=True)
class LaunchSpec:
    """A supervised engine to start: `engine_argv` is its command line (llama-server ARGS...); or,
    with `synth` (and no command), a synthetic engine doing that work. The one options object of an engine
    to start: `run`/`launch` build it from their options (cli/engines.EngineOptions.checked), the launch form
    from its fields, `up` from an `[[engine]]` (of_decl); `argv` is the command line that starts it."""

    engine_argv: tuple[str, ...]
    gpu_key: str
    weight: float = 1.0
    name: str | None = None  # None: the model file's stem (a synthetic engine's: SYNTH_NAME)
    load_timeout_s: float = 600.0
    share_group: str | None = None
    sources: SourceOptions = SourceOptions()  # --activity, --health-... (resolved by the supervisor)
    klass: str = "batch"  # the latency class (spec §7): `run --class`
    proxy: bool = True  # llama-server behind the front proxy (`run --no-proxy`: False)
    synth: SynthDecl | None = None
    slo: SloDecl | None = None  # a latency target (`run --slo-*`)

    @classmethod
    def of_decl(cls, decl: EngineDecl, gpu_key: str, share_group: str | None = None) -> LaunchSpec:
        """The engine an `[[engine]]` declares (checked: declaration.parse_engine), on `gpu_key`."""
        return cls(
            decl.command,
            gpu_key,
            decl.weight,
            name=decl.name,
            load_timeout_s=decl.load_timeout_s,
            share_group=share_group,
            sources=decl.run_options(),
            klass=decl.klass,
            synth=decl.synth,
            slo=decl.slo,
        )

    def argv(self, notify_fd: int | None = None, listen_fd: int | None = None) -> list[str]:
        """The command line that starts it: `gpushare-tui run` (its ready notice on `notify_fd`, its public
        port's listening socket `listen_fd`), or `gpushare-tui synth` (which notifies nobody)."""
        if self.synth is not None:
            return spawn.synth_argv(
                gpu_key=self.gpu_key,
                weight=self.weight,
                name=self.name or SYNTH_NAME,
                share_group=self.share_group,
                step_ms=self.synth.step_ms,
                work_units=self.synth.work_units,
                klass=self.klass,
            )
        return spawn.run_argv(
            self.engine_argv,
            gpu_key=self.gpu_key,
            weight=self.weight,
            name=self.name,
            load_timeout_s=self.load_timeout_s,
            share_group=self.share_group,
            notify_fd=notify_fd,
            sources=self.sources,
            klass=self.klass,
            proxy=self.proxy,
            listen_fd=listen_fd,
            slo=self.slo.run_options() if self.slo is not None else None,
        )


@dataclass(frozen=True)
class LaunchReply(spawn.Ready):
    """A launched engine, healthy and joined (the supervisor's notice); its supervisor runs on in
    its own session, writing `supervisor_log`."""

    supervisor_log: str

    def to_json(self) -> dict:
        return {"ok": True, **asdict(self)}

    def summary(self) -> str:
        """Three lines for a person (two for a synthetic engine: no port, no supervisor)."""
        if self.supervisor_pid == self.engine_pid:
            return f"synthetic engine pid {self.engine_pid} (slot {self.slot})\nlog {self.log}"
        return (
            f"engine pid {self.engine_pid}{'' if self.port is None else f' port {self.port}'} (slot {self.slot})\n"
            f"engine log {self.log}\nsupervisor pid {self.supervisor_pid} log {self.supervisor_log}"
        )


Started = Callable[[int, str], None]  # (pid, log) of the process just started, before the wait


def _begin_log(log: str, what: str, family_prefix: str) -> None:
    """Mark the run's start in its (new) log and collect the older logs of its family beyond
    budgets.LOG_FILES_PER_NAME_MAX (core/host/logfiles.py): one file per launch piles up otherwise."""
    logfiles.begin_run(log, what, None, time.time())
    logfiles.collect(os.path.dirname(log), logfiles.family(family_prefix))


def launch_detached(
    spec: LaunchSpec,
    *,
    cancelled: Callable[[], bool] = lambda: False,
    started: Started | None = None,
    progress: spawn.Progress | None = None,
    termination: Termination | None = None,
) -> LaunchReply:
    """Start the supervisor of `spec` (or its synthetic engine) detached and wait until the engine is
    healthy or failed; `started` is told what was started at once (the demo ends it with itself).

    UsageError without an engine command; ControlError if the state directory (logs) is
    unusable; EngineError with the engine log's tail when the engine could not be started.
    If `cancelled()` turns true meanwhile, the wait ends (GpushareError) and the launch goes
    on unobserved. `progress` (spawn.Progress) is called every POLL_S of the wait with the load
    timeout as the time allowed, and once the engine is ready; it prints, not this. Once
    `termination` has had a signal, what was started is stopped: LaunchInterrupted."""
    term = termination or Termination()
    if spec.synth is not None:
        return _launch_synth(spec, spec.synth, cancelled, started, term)
    if not spec.engine_argv:
        raise UsageError("no engine command given (use: -- llama-server ARGS...)")
    sup_log = os.path.join(state_dir(), f"supervisor-{int(time.time())}-{os.getpid()}.log")
    read_fd, write_fd = os.pipe()
    argv = spec.argv(notify_fd=write_fd)
    try:
        _begin_log(
            sup_log, f"supervisor of {printable(spec.name or os.path.basename(spec.engine_argv[0]))}", "supervisor-"
        )
        proc = spawn.spawn(argv, sup_log, pass_fds=(write_fd,))
    except OSError as e:
        os.close(read_fd)
        raise GpushareError(f"cannot start the supervisor: {e.strerror or e}") from None
    except GpushareError:  # its log may not be written (paths.open_log)
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # ours: EOF on the pipe then means the supervisor is gone
    if started is not None:
        started(proc.pid, sup_log)
    what = f"{os.path.basename(spec.engine_argv[0])} to load and join (supervisor {proc.pid})"
    t0 = time.monotonic()
    try:
        while not select.select([read_fd], [], [], 0 if term.event.is_set() else POLL_S)[0]:
            if term.event.is_set():
                raise LaunchInterrupted(_stop_supervisor(proc, sup_log, term), term.signum)
            if progress is not None:
                progress(what, time.monotonic() - t0, spec.load_timeout_s, False)
            if cancelled():
                _reap_later(proc)
                raise GpushareError(f"stopped waiting: supervisor {proc.pid} goes on (log {sup_log})")
        notice = spawn.read_notice(read_fd)
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
        raise (EngineFinished if notice.finished else EngineError)(notice.error, notice.log_tail)
    if progress is not None:
        progress(what, time.monotonic() - t0, spec.load_timeout_s, True)
    return LaunchReply(**asdict(notice), supervisor_log=sup_log)


def _launch_synth(
    spec: LaunchSpec, synth: SynthDecl, cancelled: Callable[[], bool], started: Started | None, term: Termination
) -> LaunchReply:
    """`gpushare-tui synth` detached (its own session, its output to a log in the state directory),
    ready once it serves its control socket (it has joined then); EngineError with its log's tail
    if it exits first or is not ready within SYNTH_READY_TIMEOUT_S (it is stopped then)."""
    from ..host.logtail import tail_text
    from ..pacing import control

    name = spec.name or SYNTH_NAME
    log = os.path.join(state_dir(), f"synth-{file_name_part(name)}-{int(time.time())}-{os.getpid()}.log")
    argv = replace(spec, name=name, synth=synth).argv()
    try:
        _begin_log(log, name, f"synth-{file_name_part(name)}-")
        proc = spawn.spawn(argv, log)
    except OSError as e:
        raise GpushareError(f"cannot start the synthetic engine: {e.strerror or e}") from None
    if started is not None:
        started(proc.pid, log)
    deadline = time.monotonic() + SYNTH_READY_TIMEOUT_S
    while not control.is_managed(proc.pid):
        if term.event.is_set():
            raise LaunchInterrupted(_stop_supervisor(proc, log, term, SYNTH_WHAT), term.signum)
        if proc.poll() is not None:
            raise EngineError(f"synthetic engine exited (code {proc.returncode}) before it joined", tail_text(log))
        if cancelled():
            _reap_later(proc)
            raise GpushareError(f"stopped waiting: synthetic engine {proc.pid} goes on (log {log})")
        if time.monotonic() > deadline:
            _stop_supervisor(proc, log, None, SYNTH_WHAT)
            raise EngineError(f"{SYNTH_WHAT} not ready within {SYNTH_READY_TIMEOUT_S:g} s: stopped", tail_text(log))
        time.sleep(POLL_S)
    _reap_later(proc)
    slot = None
    try:
        slot = control.StatusReply.from_json(control.request(proc.pid, "status", 1.0)).slot
    except control.ControlError:
        pass  # it serves; the slot is only shown
    return LaunchReply(proc.pid, 0, "", log, slot, proc.pid, supervisor_log=log)


def _stop_supervisor(proc: subprocess.Popen, sup_log: str, term: Termination | None, what: str = "supervisor") -> str:
    """SIGTERM the supervisor (it ends its engine in order) and wait for it, up to
    INTERRUPT_STOP_WAIT_S, or until a second signal reaches `term` (it has been told already: don't
    wait); one line saying so. `what`: what `proc` is (a synthetic engine is its own)."""
    told = term.count if term is not None else 0
    try:
        proc.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + INTERRUPT_STOP_WAIT_S
    while proc.poll() is None:
        if term is not None and term.count > told:
            _reap_later(proc)
            return f"interrupted: {what} {proc.pid} told to stop (log {sup_log})"
        if time.monotonic() > deadline:
            _reap_later(proc)
            waited = f"{INTERRUPT_STOP_WAIT_S:g} s"
            return f"interrupted: {what} {proc.pid} told to stop, still ending after {waited} (log {sup_log})"
        time.sleep(POLL_S / 4)
    return f"interrupted: {what} {proc.pid}{' and its engine' if what == 'supervisor' else ''} stopped"


def _reap_later(proc: subprocess.Popen) -> None:
    """The supervisor stays our child until it exits: reap it then, or a long-lived caller
    (the dashboard) keeps a zombie per launch."""
    threading.Thread(target=proc.wait, name="gpushare-reap", daemon=True).start()
