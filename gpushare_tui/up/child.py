"""One process `up` owns: a declared engine (a `gpushare-tui run` supervisor of its command, or a
`gpushare-tui synth`) or the embedded `gpushare-tui serve`. Non-blocking: the owner loop calls
`tick()`. An explicit state machine (`State`, `PREDECESSORS`): every change goes through
`Child._to`, which refuses an illegal one and says the change in one line."""

from __future__ import annotations

import enum
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from ..core.engines import spawn
from ..core.engines.declaration import LLAMA_SERVER
from ..core.engines.llama_server import public_address
from ..core.host.listen_fds import ListenFdError, bind_listening
from ..core.host.paths import UntrustedPathError, up_log_path
from ..core.host.text import printable
from ..core.pacing import control
from ..core.pacing.sockets import socket_path
from ..core.registry.ownership import ENV, STOP_EVENT, Owner
from .backoff import RESET_AFTER_S, Backoff
from .config import EngineDecl, UpConfig

STOP_GRACE_S = 13.0  # a supervisor gives its engine 10 s after SIGTERM before SIGKILL; then ours
READY_STATUS_TIMEOUT_S = 1.0
# A child that never got ready this many starts in a row, failing the same way each time (its log's
# last line, or the supervisor's notice), has a cause that will not go away by itself (a port in
# use, a bad model): it is not started again until a reload (unless restart = "always").
GIVE_UP_AT = 5
USAGE_EXIT = 2  # our CLI's exit status for invalid input: given up at once (restarting cannot fix it)
CAUSE_MAX_BYTES = 4096  # of the log written since the start, read for the cause of a failure
CAUSE_MAX_CHARS = 240
SERVE_READY = "serve: listening on "  # the serve child's first line once it has bound
LISTEN_BACKLOG = 128  # an engine's public socket: connections that wait while its supervisor restarts


class State(enum.Enum):
    NEW = "new"  # declared, never started
    STARTING = "starting"  # its process runs; not ready yet (no notice / control socket)
    RUNNING = "running"  # ready: the engine is healthy and joined (serve: started)
    STOPPING = "stopping"  # SIGTERM sent; SIGKILL after STOP_GRACE_S
    BACKOFF = "backoff"  # exited or failed to start; started again at `next_start_mono`
    STOPPED = "stopped"  # not restarted until a reload (by request, by its restart policy, or by a stop)
    REMOVED = "removed"  # stopped for good: no longer declared (the owner drops it)


# the states each state may be entered from
PREDECESSORS: dict[State, frozenset[State]] = {
    State.NEW: frozenset(),
    State.STARTING: frozenset({State.NEW, State.BACKOFF, State.STOPPED}),
    State.RUNNING: frozenset({State.STARTING}),
    State.STOPPING: frozenset({State.STARTING, State.RUNNING, State.STOPPING}),
    State.BACKOFF: frozenset({State.NEW, State.STARTING, State.RUNNING, State.BACKOFF, State.STOPPED}),
    State.STOPPED: frozenset(set(State) - {State.REMOVED}),
    State.REMOVED: frozenset(set(State) - {State.REMOVED}),
}


class IllegalTransition(RuntimeError):
    """A programming error: a state change its predecessor does not allow."""


def _say_default(line: str) -> None:
    print(f"gpushare-tui up: {line}", file=sys.stderr, flush=True)


class Child:
    """A declared engine (`decl`, on registry key `key`) or, with `decl` None, `up`'s serve."""

    def __init__(
        self,
        decl: EngineDecl | None,
        key: str | None,
        cfg: UpConfig,
        log_dir: str,
        say: Callable[[str], None] = _say_default,
        serve_listen: str | None = None,
    ) -> None:
        self.decl, self.key, self.cfg = decl, key, cfg
        self.serve_listen = serve_listen
        self.name = decl.name if decl else "serve"
        self.log_dir, self.say = log_dir, say
        self.state = State.NEW
        self.proc: subprocess.Popen | None = None
        self.engine_pid: int | None = None
        self.backoff = Backoff()
        self.restarts = 0
        self.ready_mono: float | None = None
        self.next_start_mono = 0.0
        self.stop_deadline = 0.0
        self.ever_resolved = False  # first start ready or failed (sd_notify READY)
        self._then: str | None = None  # after stopping: "restart" | "remove" | None
        self._notify_r: int | None = None
        self._events_r: int | None = None
        self._stop_seen = False
        self._started_weight: float | None = None
        self.log_path: str | None = None
        self._log_start = 0  # the log's size when this start began: what follows is this run's
        self._cause: str | None = None  # why the current start failed (the notice), if it said
        self._same_failures = 0  # starts in a row that never got ready, failing with `_last_cause`
        self._last_cause: str | None = None
        # the public port's listening socket (a llama-server behind its front proxy), handed to each start:
        # while its supervisor is restarted, connections wait in its backlog instead of being refused
        self.listener: socket.socket | None = None
        self._listening_on: tuple[str, int] | None = None

    # -- the state machine ----------------------------------------------------------

    def _check(self, new: State) -> None:
        if self.state not in PREDECESSORS[new]:
            raise IllegalTransition(f"{self.name}: {self.state.value} -> {new.value}")

    def _to(self, new: State, line: str | None = None, *, restarting: bool = False) -> None:
        """Enter `new` (IllegalTransition if the current state does not lead there), saying `line`."""
        self._check(new)
        self.state = new
        if new in (State.STOPPED, State.REMOVED) and not restarting:  # connections are refused, not left waiting
            self._close_listener()
        if line is not None:
            self.say(f"{self.name}: {line}")

    # -- argv ----------------------------------------------------------------

    def argv(self, notify_fd: int, listen_fd: int | None = None) -> list[str]:
        if self.decl is None:
            return spawn.serve_argv(self.serve_listen or "")
        d, key, group = self.decl, self.key or "", self.cfg.share_group
        if d.synth is not None:
            return spawn.synth_argv(
                gpu_key=key,
                weight=d.weight,
                name=d.name,
                share_group=group,
                step_ms=d.synth.step_ms,
                work_units=d.synth.work_units,
                klass=d.klass,
            )
        return spawn.run_argv(
            d.command,
            gpu_key=key,
            weight=d.weight,
            name=d.name,
            load_timeout_s=d.load_timeout_s,
            share_group=group,
            notify_fd=notify_fd,
            klass=d.klass,
            sources=d.run_options(),
            listen_fd=listen_fd,
            slo=d.slo.run_options() if d.slo is not None else None,
        )

    # -- life ------------------------------------------------------------------

    def start(self) -> None:
        """Start now (from the main thread: PR_SET_PDEATHSIG follows the thread that forks)."""
        self._check(State.STARTING)
        self._close_pipes()
        self._stop_seen = False
        self.engine_pid = None
        self.ready_mono = None
        env = dict(os.environ)
        pass_fds: list[int] = []
        notify_w = events_w = -1
        listen_fd: int | None = None
        if self.decl is not None:
            self._started_weight = self.decl.weight
            env.update(dict(self.decl.env))
            self._notify_r, notify_w = os.pipe2(os.O_CLOEXEC)
            self._events_r, events_w = os.pipe2(os.O_CLOEXEC)
            os.set_blocking(self._events_r, False)
            pass_fds = [notify_w, events_w]
            listen_fd = self._listen_fd()
            if listen_fd is not None:
                pass_fds.append(listen_fd)
            env[ENV] = Owner(
                os.path.abspath(self.cfg.path), os.getpid(), self.decl.weight, self.restarts, events_w
            ).to_env()
        log_path = self.log_path = up_log_path(self.log_dir, self.cfg.path, self.name)
        self._log_start = _size(log_path)
        self._cause = None
        try:
            # `up` SIGKILLed: each supervisor gets SIGTERM and ends its engine (SIGCONT first), so
            # nothing is left stopped, nor running unowned for a restarted `up` to collide with.
            self.proc = spawn.spawn(
                self.argv(notify_w, listen_fd),
                log_path,
                env=env,
                cwd=self.cfg.directory,
                pass_fds=pass_fds,
                parent_death=signal.SIGTERM,
            )
        except (OSError, UntrustedPathError) as e:
            self.say(f"{self.name}: cannot start: {getattr(e, 'strerror', None) or e}")
            self._failed(None, 0.0)
            return
        finally:
            for fd in (notify_w, events_w):
                if fd >= 0:
                    os.close(fd)
        self._to(State.STARTING, f"starting (pid {self.proc.pid}, log {log_path})")

    def stop(self, then: str | None = None) -> None:
        """SIGTERM to the supervisor (it continues and ends its engine: TERM, 10 s, KILL), then ours.
        `then`: "restart" (start it again once stopped) or "remove" (it ends REMOVED)."""
        self._then = then
        if self.proc is None or self.proc.poll() is not None or self.state not in (State.STARTING, State.RUNNING):
            if self.state is not State.STOPPING:
                self._after_stop(None)
            return  # (already stopping: `then` is what follows it now)
        self._to(State.STOPPING, f"stopping (SIGTERM to pid {self.proc.pid})")
        self.stop_deadline = time.monotonic() + STOP_GRACE_S
        try:
            os.kill(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def redeclare(self, decl: EngineDecl, key: str, cfg: UpConfig) -> list[str]:
        """Apply a reloaded file's declaration of this engine: a new weight is set live, a stopped
        engine starts again, any other change restarts it. What was done, for the reload line."""
        assert self.decl is not None, "a serve child is replaced, not redeclared"
        old, self.decl, self.cfg = self.decl, decl, cfg
        if self._then == "remove":  # removed by an earlier reload, declared again before it stopped
            self.key, self._then = key, "restart"
            return [f"restarted {decl.name}"]
        if not (old.same_but_weight(decl) and self.key == key):
            self.key = key
            self.stop(then="restart")
            return [f"restarted {decl.name}"]
        done: list[str] = []
        if decl.weight != old.weight:
            self._reweight(decl.weight)
            done.append(f"{decl.name} weight {decl.weight:g}")
        if self.state is State.STOPPED:
            self.start()
            done.append(f"started {decl.name} again")
        return done

    def tick(self, now: float) -> None:
        if self.state is State.BACKOFF and now >= self.next_start_mono:
            self.start()
            return
        if self.proc is None or self.state not in (State.STARTING, State.RUNNING, State.STOPPING):
            return
        code = self.proc.poll()
        if self.state is State.STARTING and code is None:
            self._check_ready()
        if code is not None:
            self._exited(code)
        elif self.state is State.STOPPING and now > self.stop_deadline:
            self.say(f"{self.name}: still running {STOP_GRACE_S:g} s after SIGTERM: SIGKILL")
            self._kill_all()
        elif self.state is State.RUNNING and self.ready_mono is not None and now - self.ready_mono >= RESET_AFTER_S:
            self.backoff.failures = 0

    def wait_fds(self) -> list[int]:
        return [fd for fd in (self._notify_r,) if fd is not None and self.state is State.STARTING]

    # -- internals -------------------------------------------------------------

    def _listen_fd(self) -> int | None:
        """The fd of this engine's public listening socket, bound at its first start and kept across restarts
        (rebound when a reload moves it); None when it has none: not a llama-server behind its front proxy,
        or the port cannot be bound (its supervisor then tries, and says why it cannot)."""
        d = self.decl
        where = public_address(d.command) if d is not None and d.engine_kind == LLAMA_SERVER else None
        if where is not None and self.listener is not None and where == self._listening_on:
            return self.listener.fileno()
        self._close_listener()
        if where is None:
            return None
        try:
            self.listener = bind_listening(where, LISTEN_BACKLOG)
        except ListenFdError:
            return None
        self._listening_on = where
        return self.listener.fileno()

    def _close_listener(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = self._listening_on = None

    def _check_ready(self) -> None:
        assert self.proc is not None
        if self.decl is None:  # serve: ready once it says it has bound (it may exit instead: port in use)
            line = next((ln for ln in self._log_since_start() if SERVE_READY in ln), None)
            if line is not None:
                self._ready(
                    self.proc.pid, None, listening=line.split(SERVE_READY, 1)[1].split()[0].removeprefix("http://")
                )
            return
        if self.decl.synth is not None:
            if os.path.exists(socket_path(self.proc.pid)):
                self._ready(self.proc.pid, None)
            return
        if self._notify_r is None or not select.select([self._notify_r], [], [], 0)[0]:
            return
        try:
            notice = spawn.read_notice(self._notify_r)
        except spawn.NoticeError as e:
            notice = spawn.Failed(str(e))
        os.close(self._notify_r)
        self._notify_r = None
        if isinstance(notice, spawn.Ready):
            self._ready(notice.engine_pid, notice.slot)
        elif notice is not None:  # None: closed without a notice; it is exiting, _exited says so
            last = next((ln for ln in reversed(notice.log_tail.splitlines()) if ln.strip()), None)
            self._cause = _one_line(notice.error + (f"; its log's last line: {last}" if last else ""))
            self.say(f"{self.name}: failed to start: {self._cause}")

    def _log_since_start(self) -> list[str]:
        """The lines of this start's log written since it began (at most CAUSE_MAX_BYTES, the last)."""
        if self.log_path is None:
            return []
        try:
            with open(self.log_path, "rb") as f:
                end = f.seek(0, os.SEEK_END)
                f.seek(max(self._log_start, end - CAUSE_MAX_BYTES))
                data = f.read(CAUSE_MAX_BYTES)
        except OSError:
            return []
        return data.decode("utf-8", "replace").splitlines()

    def failure_cause(self, code: int) -> str | None:
        """Why this start ended (exit status `code`), in one line: the supervisor's notice, else, when it
        exited by itself (a signal's victim's last line is no cause), the last line its log got since
        the start (a child's error line: `gpushare-tui: cannot listen on ...: the port is in use`)."""
        if self._cause is not None:
            return self._cause
        if code <= 0:
            return None
        last = next((ln for ln in reversed(self._log_since_start()) if ln.strip()), None)
        return None if last is None else _one_line(last)

    def _ready(self, engine_pid: int, slot: int | None, listening: str | None = None) -> None:
        self.engine_pid = engine_pid
        self.ready_mono = time.monotonic()
        self.ever_resolved = True
        self._same_failures, self._last_cause = 0, None
        if self.decl is None:
            self._to(State.RUNNING, f"listening on {listening or self.serve_listen} (pid {engine_pid})")
            return
        weight: float | None = self.decl.weight
        try:
            if self._started_weight != self.decl.weight:  # a reload while it was starting
                control.request(engine_pid, "set_weight", READY_STATUS_TIMEOUT_S, weight=weight, config=True)
            st = control.StatusReply.from_json(control.request(engine_pid, "status", READY_STATUS_TIMEOUT_S))
            slot, weight = st.slot, st.weight
        except control.ControlError as e:
            self.say(f"{self.name}: control socket: {e}")
        shown = "?" if weight is None else f"{weight:g}"
        self._to(State.RUNNING, f"ready: engine pid {engine_pid}, slot {slot}, weight {shown}, gpu key {self.key}")

    def _reweight(self, weight: float) -> None:
        if self.state is not State.RUNNING or self.engine_pid is None:
            return  # it starts with the file's weight
        try:
            control.request(self.engine_pid, "set_weight", weight=weight, config=True)
        except control.ControlError as e:
            self.say(f"{self.name}: weight {weight:g} not applied: {e}")

    def _exited(self, code: int) -> None:
        assert self.proc is not None
        healthy_s = time.monotonic() - self.ready_mono if self.ready_mono is not None else 0.0
        self._stop_seen = self._stop_seen or self._read_stop_event()
        if code < 0 and self.engine_pid is not None and self.engine_pid != self.proc.pid:
            _end_group(self.engine_pid)  # its supervisor died abruptly: the engine runs on unpaced
        self.proc = None
        self.ever_resolved = True
        shown = f"code {code}" if code >= 0 else f"signal {-code}"
        if self.state is State.STOPPING:
            self._after_stop(f"stopped ({shown})")
            return
        if self._stop_seen:
            self._to(State.STOPPED, f"stopped on request ({shown}); not restarted until a reload")
            return
        policy = self.decl.restart if self.decl else "on-failure"
        cause = self.failure_cause(code)
        because = f": {cause}" if cause else ""
        if policy == "never" or (policy == "on-failure" and code == 0):
            self._to(State.STOPPED, f"exited ({shown}){because}; restart = {policy}: not restarted")
            return
        never_ready = self.ready_mono is None
        self._same_failures = self._same_failures + 1 if never_ready and cause == self._last_cause else int(never_ready)
        self._last_cause = cause if never_ready else None
        if policy != "always" and never_ready and (code == USAGE_EXIT or self._same_failures >= GIVE_UP_AT):
            why = (
                f"{self._same_failures} starts in a row not ready, failing the same way"
                if self._same_failures >= GIVE_UP_AT
                else f"exit {USAGE_EXIT} is invalid input, which a restart cannot fix"
            )
            self._to(
                State.STOPPED,
                f"exited ({shown}){because}; gave up: {why} "
                f"(fix the cause, then reload: `gpushare-tui up --reload {self.cfg.path}`)",
            )
            return
        self._failed(shown, healthy_s, because)

    def _failed(self, shown: str | None, healthy_s: float, because: str = "") -> None:
        delay = self.backoff.on_exit(healthy_s)
        self.ever_resolved = True
        self.restarts += 1
        self.next_start_mono = time.monotonic() + delay
        loop = f"; crash loop: {self.backoff.failures} failures in a row" if self.backoff.crash_loop else ""
        when = "before it was ready" if self.ready_mono is None else f"after {healthy_s:.1f} s healthy"
        what = f"exited ({shown}) {when}{because}" if shown else "failed"
        self._to(State.BACKOFF, f"{what}; restart {self.restarts} in {delay:g} s{loop}")

    def _after_stop(self, line: str | None) -> None:
        then, self._then = self._then, None
        self._close_pipes()
        self._to(State.REMOVED if then == "remove" else State.STOPPED, line, restarting=then == "restart")
        if then == "restart":
            self.backoff = Backoff()
            self.start()

    def _read_stop_event(self) -> bool:
        if self._events_r is None:
            return False
        try:
            return STOP_EVENT in os.read(self._events_r, 4096)
        except (BlockingIOError, OSError):
            return False

    def _kill_all(self) -> None:
        if self.engine_pid is not None:
            _end_group(self.engine_pid)
        if self.proc is not None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(self.proc.pid, sig)
                except ProcessLookupError:
                    pass

    def _close_pipes(self) -> None:
        for attr in ("_notify_r", "_events_r"):
            fd = getattr(self, attr)
            if fd is not None:
                os.close(fd)
                setattr(self, attr, None)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _one_line(text: str) -> str:
    """A cause for up's stderr: printable, one line, at most CAUSE_MAX_CHARS."""
    line = printable(" ".join(text.split()))
    return line if len(line) <= CAUSE_MAX_CHARS else line[: CAUSE_MAX_CHARS - 1] + "…"


def _end_group(pid: int) -> None:
    """Continue and kill what is left of an engine's process group (its supervisor is gone)."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
