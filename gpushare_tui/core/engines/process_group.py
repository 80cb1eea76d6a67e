"""An engine's process group, from outside: SIGSTOP/SIGCONT to the whole of it (the engine leads its group:
workers it starts are paced with it), its descendants that leave the group (setsid, setpgid) followed by
pidfd (signals through one never reach a reused pid) and paced and ended with it, and its continued time.
Every signal goes out under one lock, so a descendant found meanwhile joins the group's state."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

from ..host.budgets import ESCAPED_DESCENDANTS_MAX
from ..host.clock import mono_us
from ..host.text import printable
from . import activity, watchdog

STOP_GRACE_S = 10.0  # SIGTERM to SIGKILL, ending the engine: here, and by its watchdog if we die


class EngineGroup:
    """The engine's process group (`proc`: its leader, set once it is started) and its escaped descendants.
    `suspend`/`resume` stop and continue all of it; `run_us` is its continued time; `wait_continued` waits
    for the next continue (a probe refused while stopped goes out then)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.proc: subprocess.Popen | None = None
        self.watchdog: watchdog.Watchdog | None = None
        self.ours: Callable[[], Sequence[int]] = tuple  # our own children beside the engine (the front proxy's)
        self._say = say
        self._lock = threading.Lock()
        self.stopped = False
        # descendants that left the engine's process group: pid -> its pidfd; paced and ended with the group
        self._escaped: dict[int, int] = {}
        self._continued = threading.Condition()  # notified at each continue
        self._continues = 0
        self._run_us = 0  # the engine's continued time, up to _resumed_us (see run_us)
        self._resumed_us = mono_us()

    def _signal(self, sig: int) -> None:
        proc = self.proc
        assert proc is not None  # signals go out only once the engine was started
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        _pidfd_signal(list(self._escaped.values()), sig)

    def suspend(self) -> None:
        with self._lock:
            if not self.stopped:
                self.stopped = True  # before the signal: the monitor must not probe now
                self._run_us += mono_us() - self._resumed_us
                # the engine's state stays "running": a pause outside its TDM window is pacing, many
                # times a second, not a stopped engine (the dashboard's timeline shows who runs)
                self._signal(signal.SIGSTOP)

    def resume(self, force: bool = False) -> None:
        with self._lock:
            continued = self.stopped or force
            if continued:
                self._signal(signal.SIGCONT)
            if self.stopped:
                self._resumed_us = mono_us()
            self.stopped = False
        if continued:
            with self._continued:
                self._continues += 1
                self._continued.notify_all()

    def wait_continued(self, timeout_s: float) -> None:
        """Until the engine is next continued (a SIGCONT, or shutdown's), or `timeout_s`."""
        with self._continued:
            seen = self._continues
            self._continued.wait_for(lambda: self._continues != seen, timeout_s)

    def run_us(self) -> int:
        """The engine's total continued (not stopped) time so far, µs (monotonic)."""
        with self._lock:
            return self._run_us + (0 if self.stopped else mono_us() - self._resumed_us)

    def track_escaped(self, pids: Sequence[int]) -> None:
        """At each look at the tree (`pids`: the engine first): a descendant outside the engine's process
        group is paced and ended with it from now on (one line says so), and its watchdog ends it too if we
        die. Ones that exited are dropped. Descendants re-parented to us (we are a subreaper:
        spawn.adopt_orphans; a double fork) count too, and are reaped."""
        proc = self.proc
        assert proc is not None
        adopted = self._adopted()
        for pid in [*pids[1:], *adopted]:
            if pid in self._escaped or len(self._escaped) >= ESCAPED_DESCENDANTS_MAX:
                continue
            try:
                if os.getpgid(pid) == proc.pid:
                    continue
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # gone (or no fd left: the monitor says EMFILE elsewhere)
            with self._lock:
                self._escaped[pid] = fd
                if self.stopped:  # it joins the group's state
                    signal.pidfd_send_signal(fd, signal.SIGSTOP)
            if self.watchdog is not None:
                self.watchdog.track(pid)
            self._say(
                f"gpushare-tui: pid {pid} ({_comm(pid)}) left the engine's process group {proc.pid}:"
                " paced and ended with the engine"
            )
        for pid, fd in list(self._escaped.items()):
            if _exited(fd):
                with self._lock:
                    del self._escaped[pid]
                os.close(fd)
        _reap(adopted)

    def _adopted(self) -> list[int]:
        """Our descendants other than the engine's tree, the watchdog and our own (`ours`: the front proxy's
        process, never paced): the engine's orphans, re-parented to us (and theirs)."""
        proc, dog = self.proc, self.watchdog
        skip = {proc.pid if proc else 0, dog.pid if dog else 0, *self.ours()}
        kids = [p for p in activity.ProcessTree.children_of(os.getpid()) if p not in skip]
        return [*kids, *(d for k in kids for d in activity.ProcessTree(k, refresh_s=0).pids()[1:])]

    def terminate(self) -> None:
        """SIGTERM to all of it; SIGKILL after STOP_GRACE_S if the leader has not exited."""
        assert self.proc is not None
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)

    def end_rest(self) -> None:
        """The leader is gone: continue the group's workers that live on (they were continued with it before
        it was ended; this covers a leader that died by itself), then end its escaped descendants too
        (continued, SIGTERM, SIGKILL after STOP_GRACE_S), so nothing of it outlives it."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGCONT)
        except OSError:
            pass
        with self._lock:
            escaped, self._escaped = self._escaped, {}
        fds = list(escaped.values())
        _pidfd_signal(fds, signal.SIGCONT, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        alive = [fd for fd in fds if not _exited(fd)]
        while alive and time.monotonic() < deadline:
            select.select(alive, [], [], max(0.0, deadline - time.monotonic()))  # a pidfd reads ready on exit
            alive = [fd for fd in alive if not _exited(fd)]
        _pidfd_signal(alive, signal.SIGCONT, signal.SIGKILL)
        for fd in fds:
            os.close(fd)


def _pidfd_signal(pidfds: Sequence[int], *sigs: int) -> None:
    """Each signal in turn to each process (one that exited is skipped: pruned at the next tree look)."""
    for sig in sigs:
        for fd in pidfds:
            try:
                signal.pidfd_send_signal(fd, sig)
            except OSError:
                pass


def _reap(pids: Sequence[int]) -> None:
    """Reap those of `pids` that are our exited children (adopted orphans: nobody else waits for them)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _exited(pidfd: int) -> bool:
    """Whether the process of `pidfd` exited (its pidfd reads ready; a zombie counts)."""
    return bool(select.select([pidfd], [], [], 0)[0])


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return printable(f.read().strip())
    except OSError:
        return "?"
