"""The `up` owner loop: start every declared engine, restart the ones that exit (per policy,
with backoff), reload the file on SIGHUP, stop everything on SIGTERM/SIGINT.

Runs in the main thread: signal handlers only set flags and wake the loop (core/host/lifecycle.py),
and every child is forked from this thread (their PR_SET_PDEATHSIG follows it)."""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable

from ..core.host import budgets, paths
from ..core.host.errors import GpushareError
from ..core.host.lifecycle import SignalWakeup, on_signals
from ..core.observe.gpu import GpuKeyError, gpu_key_for_index
from ..core.pacing.sockets import check_socket_dir
from . import config as cfgmod
from .backoff import Backoff
from .child import Child, State
from .config import ConfigError, EngineDecl, UpConfig
from .lock import UpLock

TICK_S = 0.2


def _say_default(line: str) -> None:
    print(f"gpushare-tui up: {line}", file=sys.stderr, flush=True)


def engine_key(cfg: UpConfig, decl: EngineDecl) -> str:
    """The registry key of `decl`: its own gpu_key / gpu, else the file's, else GPU 0's UUID.
    ConfigError naming the file and engine when a GPU index has no key here."""
    if decl.gpu_key is not None:
        return decl.gpu_key
    index = decl.gpu if decl.gpu is not None else None
    if index is None and cfg.gpu_key is not None:
        return cfg.gpu_key
    index = index if index is not None else (cfg.gpu or 0)
    try:
        return gpu_key_for_index(index, key_hint='set gpu_key = "KEY" (in the file or the [[engine]] table)')
    except GpuKeyError as e:
        raise ConfigError(f"{cfg.path}: engine {decl.name!r}: gpu {index}: {e}") from None


def check(path: str) -> tuple[UpConfig, dict[str, str]]:
    """Load `path` and check what depends on this host too (keys, the share group): the
    config and each engine's key; ConfigError (one line) otherwise."""
    cfg = cfgmod.load(path)
    if cfg.share_group is not None:
        from ..core.registry.segment import resolve_group

        try:
            resolve_group(cfg.share_group)
        except GpushareError as e:
            raise ConfigError(f"{path}: share_group: {e}") from None
    keys = {d.name: engine_key(cfg, d) for d in cfg.engines}
    for name, key in keys.items():  # a gpu index and its UUID name one registry too
        if sum(k == key for k in keys.values()) > budgets.ENGINES_PER_KEY_MAX:
            raise ConfigError(
                f"{path}: engine {name!r}: more than {budgets.ENGINES_PER_KEY_MAX} engines on key {key} "
                "(the registry has that many slots)"
            )
    return cfg, keys


class Up:
    def __init__(self, path: str, say: Callable[[str], None] = _say_default) -> None:
        """Check `path` and take its lock. From the first line on, SIGHUP is a reload and SIGTERM/SIGINT
        a stop (flags `run` acts on): the lock's pid is what `up --reload` signals, at any moment."""
        self._quit = self._reload = False
        restore_signals = on_signals(self._on_signal)
        self.path = path
        self.say = say
        try:
            self.cfg, keys = check(path)
            check_socket_dir()
            self.log_dir = paths.state_dir()
            self.lock = UpLock(path)  # last: nothing after it may fail
        except BaseException:
            restore_signals()
            raise
        self.children: dict[str, Child] = {
            d.name: Child(d, keys[d.name], self.cfg, self.log_dir, say) for d in self.cfg.engines
        }
        self.serve: Child | None = self._serve_child(self.cfg)
        self._retiring: list[Child] = []  # a replaced serve, until it has stopped
        self._notified_ready = False

    def _serve_child(self, cfg: UpConfig) -> Child | None:
        if cfg.serve is None:
            return None
        return Child(None, None, cfg, self.log_dir, self.say, serve_listen=cfg.serve.listen)

    def _all(self) -> list[Child]:
        return [*self.children.values(), *([self.serve] if self.serve else []), *self._retiring]

    # -- signals ---------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGHUP:
            self._reload = True
        else:
            self._quit = True

    def run(self) -> int:
        """Until SIGTERM/SIGINT; 0 once every engine is stopped and its slot left."""
        wakeup = SignalWakeup()
        try:
            self.say(
                f"{self.path}: {len(self.children)} engine(s){', serve' if self.serve else ''} (pid {os.getpid()})"
            )
            for c in self._all():
                if self._quit:  # stopped while starting: start no more
                    break
                c.start()
            while not self._quit:
                fds = [wakeup.fd] + [fd for c in self._all() for fd in c.wait_fds()]
                select.select(fds, [], [], TICK_S)
                wakeup.drain()
                if self._quit:
                    break
                if self._reload:
                    self._reload = False
                    self.reload()
                now = time.monotonic()
                for c in self._all():
                    c.tick(now)
                self.children = {n: c for n, c in self.children.items() if c.state is not State.REMOVED}
                self._retiring = [c for c in self._retiring if c.state is State.STOPPING]
                if not self._notified_ready and all(c.ever_resolved for c in self._all()):
                    self._notified_ready = True
                    sd_notify("READY=1")
            self._stop_all()
        finally:
            wakeup.close()
            self.lock.release()
        self.say("all engines stopped")
        return 0

    def _stop_all(self) -> None:
        sd_notify("STOPPING=1")
        self.say("stopping every engine")
        for c in self._all():
            c.stop()
        while any(c.state is State.STOPPING for c in self._all()):
            time.sleep(0.05)
            now = time.monotonic()
            for c in self._all():
                c.tick(now)

    # -- reload ------------------------------------------------------------------

    def reload(self) -> None:
        """Apply the file again: re-weight in place, start added engines, stop removed ones,
        restart those whose declaration changed otherwise. An invalid file changes nothing."""
        try:
            new, keys = check(self.path)
        except GpushareError as e:
            self.say(f"reload failed, nothing changed: {e}")
            return
        sd_notify("RELOADING=1")
        done: list[str] = []
        for name, c in list(self.children.items()):
            if new.engine(name) is None:
                c.stop(then="remove")
                done.append(f"stopped {name}")
        for d in new.engines:
            known = self.children.get(d.name)
            if known is not None:
                done += known.redeclare(d, keys[d.name], new)
                continue
            added = self.children[d.name] = Child(d, keys[d.name], new, self.log_dir, self.say)
            added.start()
            done.append(f"started {d.name}")
        if new.serve != self.cfg.serve:
            if self.serve is not None:
                self.serve.stop(then="remove")
                self._retiring.append(self.serve)
            self.serve = self._serve_child(new)
            if self.serve is not None:
                self.serve.start()
            done.append("serve")
        elif self.serve is not None and self.serve.state is State.STOPPED:  # given up: try again
            self.serve.backoff = Backoff()
            self.serve.start()
            done.append("started serve again")
        self.cfg = new
        self.say(f"reloaded {self.path}: {', '.join(done) if done else 'no change'}")
        sd_notify("READY=1")


def sd_notify(state: str) -> None:
    """systemd's readiness protocol (Type=notify), when NOTIFY_SOCKET is set; else nothing."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(state.encode(), addr)
    except OSError:
        pass
