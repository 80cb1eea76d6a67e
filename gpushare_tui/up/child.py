"""One process `up` owns: a declared engine (a `gpushare-tui run` supervisor of its command, or a
`gpushare-tui synth`) or the embedded `gpushare-tui serve`. Non-blocking: the owner loop calls
`tick()`; every state change is said in one line."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from ..core import control
from ..core.ownership import ENV, STOP_EVENT, Owner
from .backoff import Backoff
from .config import EngineDecl, UpConfig

PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 13.0  # a supervisor gives its engine 10 s after SIGTERM before SIGKILL; then ours
READY_STATUS_TIMEOUT_S = 1.0


def _say_default(line: str) -> None:
    print(f"gpushare-tui up: {line}", file=sys.stderr, flush=True)


def _pdeathsig(parent: int) -> Callable[[], None]:
    def setup() -> None:
        # `up` SIGKILLed: each supervisor gets SIGTERM and ends its engine (SIGCONT first), so
        # nothing is left stopped, nor running unowned for a restarted `up` to collide with.
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # `up` died before the prctl
            os._exit(1)

    return setup


class Child:
    """states: starting → running → (exit) → backoff → starting ...; stopping; stopped (not
    restarted until a reload: by request, by policy, or removed)."""

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
        self.state = "new"
        self.proc: subprocess.Popen | None = None
        self.engine_pid: int | None = None
        self.backoff = Backoff()
        self.restarts = 0
        self.ready_mono: float | None = None
        self.next_start_mono = 0.0
        self.stop_deadline = 0.0
        self.then: str | None = None  # after stopping: "restart" | "remove" | None
        self.ever_resolved = False  # first start ready or failed (sd_notify READY)
        self._notify_r: int | None = None
        self._events_r: int | None = None
        self._stop_seen = False
        self._started_weight: float | None = None

    # -- argv ----------------------------------------------------------------

    def argv(self, notify_fd: int) -> list[str]:
        base = [sys.executable, "-m", "gpushare_tui"]
        if self.decl is None:
            return [*base, "serve", "--listen", self.serve_listen or ""]
        d = self.decl
        common = ["--weight", repr(d.weight), "--gpu-key", self.key or "", "--name", d.name]
        if self.cfg.share_group:
            common += ["--share-group", self.cfg.share_group]
        if d.synth is not None:
            extra = ["--step-ms", repr(d.synth.step_ms), "--quiet"]
            if d.synth.work_units:
                extra += ["--work-units", str(d.synth.work_units)]
            return [*base, "synth", *common, *extra]
        return [
            *base,
            "run",
            *common,
            "--load-timeout",
            repr(d.load_timeout_s),
            "--notify-fd",
            str(notify_fd),
            "--",
            *d.command,
        ]

    # -- life ------------------------------------------------------------------

    def start(self) -> None:
        """Start now (from the main thread: PR_SET_PDEATHSIG follows the thread that forks)."""
        self._close_pipes()
        self._stop_seen = False
        self.engine_pid = None
        self.ready_mono = None
        env = dict(os.environ)
        pass_fds: list[int] = []
        notify_w = events_w = -1
        if self.decl is not None:
            self._started_weight = self.decl.weight
            env.update(dict(self.decl.env))
            self._notify_r, notify_w = os.pipe2(os.O_CLOEXEC)
            self._events_r, events_w = os.pipe2(os.O_CLOEXEC)
            os.set_blocking(self._events_r, False)
            pass_fds = [notify_w, events_w]
            env[ENV] = Owner(
                os.path.abspath(self.cfg.path), os.getpid(), self.decl.weight, self.restarts, events_w
            ).to_env()
        log_path = os.path.join(self.log_dir, f"up-{_safe(self.name)}.log")
        try:
            with open(log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    self.argv(notify_w),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=env,
                    cwd=self.cfg.directory,
                    pass_fds=pass_fds,
                    start_new_session=True,
                    preexec_fn=_pdeathsig(os.getpid()),
                )
        except OSError as e:
            self.say(f"{self.name}: cannot start: {e.strerror or e}")
            self._failed(None, 0.0)
            return
        finally:
            for fd in (notify_w, events_w):
                if fd >= 0:
                    os.close(fd)
        self.state = "starting"
        self.started_mono = time.monotonic()
        self.say(f"{self.name}: starting (pid {self.proc.pid}, log {log_path})")
        if self.decl is None:
            self._ready(self.proc.pid, None)

    def stop(self, then: str | None = None) -> None:
        """SIGTERM to the supervisor (it continues and ends its engine: TERM, 10 s, KILL), then ours."""
        self.then = then
        if self.proc is None or self.proc.poll() is not None or self.state in ("stopped", "backoff", "new"):
            self._after_stop()
            return
        self.state = "stopping"
        self.stop_deadline = time.monotonic() + STOP_GRACE_S
        try:
            os.kill(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def tick(self, now: float) -> None:
        if self.state == "backoff" and now >= self.next_start_mono:
            self.start()
            return
        if self.proc is None or self.state not in ("starting", "running", "stopping"):
            return
        code = self.proc.poll()
        if self.state == "starting" and code is None:
            self._check_ready()
        if code is not None:
            self._exited(code)
        elif self.state == "stopping" and now > self.stop_deadline:
            self.say(f"{self.name}: still running {STOP_GRACE_S:g} s after SIGTERM: SIGKILL")
            self._kill_all()
        elif self.state == "running" and self.ready_mono is not None and now - self.ready_mono >= 300:
            self.backoff.failures = 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_fds(self) -> list[int]:
        return [fd for fd in (self._notify_r,) if fd is not None and self.state == "starting"]

    # -- internals -------------------------------------------------------------

    def _check_ready(self) -> None:
        assert self.proc is not None and self.decl is not None
        if self.decl.synth is not None:
            if os.path.exists(control.socket_path(self.proc.pid)):
                self._ready(self.proc.pid, None)
            return
        import select

        if self._notify_r is None or not select.select([self._notify_r], [], [], 0)[0]:
            return
        data = os.read(self._notify_r, 65536)
        os.close(self._notify_r)
        self._notify_r = None
        try:
            msg = json.loads(data)
        except ValueError:
            return  # closed without a notice: it is exiting, _exited says so
        if msg.get("ok"):
            self._ready(int(msg["engine_pid"]), msg.get("slot"))
        else:
            self.say(f"{self.name}: failed to start: {msg.get('error')}")

    def _ready(self, engine_pid: int, slot: int | None) -> None:
        self.engine_pid = engine_pid
        self.state = "running"
        self.ready_mono = time.monotonic()
        self.ever_resolved = True
        if self.decl is None:
            self.say(f"serve: listening on {self.serve_listen} (pid {engine_pid})")
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
        self.say(f"{self.name}: ready: engine pid {engine_pid}, slot {slot}, weight {shown}, gpu key {self.key}")

    def _exited(self, code: int) -> None:
        assert self.proc is not None
        healthy_s = time.monotonic() - self.ready_mono if self.ready_mono is not None else 0.0
        self._stop_seen = self._stop_seen or self._read_stop_event()
        if code < 0 and self.engine_pid is not None and self.engine_pid != self.proc.pid:
            _end_group(self.engine_pid)  # its supervisor died abruptly: the engine runs on unpaced
        self.proc = None
        self.ever_resolved = True
        shown = f"code {code}" if code >= 0 else f"signal {-code}"
        if self.state == "stopping":
            self.say(f"{self.name}: stopped ({shown})")
            self._after_stop()
            return
        if self._stop_seen:
            self.say(f"{self.name}: stopped on request ({shown}); not restarted until a reload")
            self.state = "stopped"
            return
        policy = self.decl.restart if self.decl else "on-failure"
        if policy == "never" or (policy == "on-failure" and code == 0):
            self.say(f"{self.name}: exited ({shown}); restart = {policy}: not restarted")
            self.state = "stopped"
            return
        self._failed(shown, healthy_s)

    def _failed(self, shown: str | None, healthy_s: float) -> None:
        delay = self.backoff.on_exit(healthy_s)
        self.ever_resolved = True
        self.restarts += 1
        self.state = "backoff"
        self.next_start_mono = time.monotonic() + delay
        loop = f"; crash loop: {self.backoff.failures} failures in a row" if self.backoff.crash_loop else ""
        what = f"exited ({shown}) after {healthy_s:.1f} s healthy" if shown else "failed"
        self.say(f"{self.name}: {what}; restart {self.restarts} in {delay:g} s{loop}")

    def _after_stop(self) -> None:
        then, self.then = self.then, None
        self._close_pipes()
        self.state = "removed" if then == "remove" else "stopped"
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
        for pid in (self.engine_pid,):
            if pid is not None:
                _end_group(pid)
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


def _end_group(pid: int) -> None:
    """Continue and kill what is left of an engine's process group (its supervisor is gone)."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name)[:64]
