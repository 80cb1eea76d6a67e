"""An engine's process tree (vLLM, SGLang, a training job start workers) and its CPU use."""

from __future__ import annotations

import errno
import os
import time

import psutil

from ...host.budgets import EDGE_THREADS_READ_MAX

TREE_REFRESH_S = 1.0  # children(recursive=True) scans every process on the host: at most once a second
TREE_MAX_PROCESSES = 4096  # a fork bomb under the engine is not walked for ever
CPU_MIN_SPAN_US = 40_000  # a shorter span reads a burst as a rate (and /proc's CPU times come in 10 ms ticks)
GONE_ERRNOS = frozenset({errno.ENOENT, errno.ESRCH})  # a /proc read of a process or thread that exited
CPUCLOCK_SCHED = 2  # a process CPU-time clock id's low bits (the kernel's CPUCLOCK_SCHED, not per thread)


class ProcessTree:
    """The engine (`root_pid`) and its descendants, re-listed at most every TREE_REFRESH_S (a process
    whose parent exited is re-parented away: it leaves the tree, though not the process group).
    `cpu_s()` is the tree's CPU time (user + system) summed, a counter: a member that exits keeps
    the time it was last seen with, so the sum never goes back."""

    def __init__(self, root_pid: int, refresh_s: float = TREE_REFRESH_S) -> None:
        self.root_pid = root_pid
        self.refresh_s = refresh_s
        self._procs: dict[int, psutil.Process] = {}
        self._cpu_last: dict[int, float] = {}
        self._gone_s = 0.0
        self._listed_at: float | None = None
        try:
            self._root: psutil.Process | None = psutil.Process(root_pid)
        except psutil.Error:
            self._root = None

    def _refresh(self) -> None:
        now = time.monotonic()
        if self._listed_at is not None and now - self._listed_at < self.refresh_s:
            return
        self._listed_at = now
        if self._root is None:
            return
        pids = _descendants(self.root_pid)
        if pids is None:
            try:
                members = [self._root, *self._root.children(recursive=True)]
            except psutil.Error:  # the root exited: its last children, as they were, finish the sum
                members = list(self._procs.values())
            self._procs = {p.pid: p for p in members}
            return
        procs = {}
        for pid in [self.root_pid, *pids]:
            proc = self._procs.get(pid)
            if proc is None:
                try:
                    proc = psutil.Process(pid)
                except psutil.Error:
                    continue
            procs[pid] = proc
        self._procs = procs

    @staticmethod
    def children_of(pid: int, strict: bool = False) -> list[int]:
        """`pid`'s children now (every thread's: /proc/PID/task/TID/children); [] when gone. `strict`: an OSError
        other than the process or thread being gone (EMFILE: out of fds) is raised, not taken for no children."""
        kids: list[int] = []
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError as e:
            if strict and e.errno not in GONE_ERRNOS:
                raise
            return kids
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids += [int(k) for k in f.read().split()]
            except ValueError:
                continue
            except OSError as e:
                if strict and e.errno not in GONE_ERRNOS:
                    raise
                continue
        return kids

    def pids(self) -> list[int]:
        """The tree's pids as last listed (the root first)."""
        self._refresh()
        return list(self._procs)

    def cpu_s(self) -> float:
        self._refresh()
        for pid in [p for p in self._cpu_last if p not in self._procs]:  # gone at a re-listing
            self._gone_s += self._cpu_last.pop(pid)
        total = self._gone_s
        for pid in list(self._procs):
            # its process CPU-time clock: one system call, ns (psutil's cpu_times parses /proc/PID/stat: ~185 µs
            # a call in the monitor, 4 a second, and CPU time in 10 ms ticks)
            ns = process_cpu_ns(pid)
            if ns is None:  # exited: it keeps the time it was last seen with
                del self._procs[pid]
                last = self._cpu_last.pop(pid, 0.0)
                self._gone_s += last
                total += last
                continue
            cpu = self._cpu_last[pid] = ns / 1e9
            total += cpu
        return total

    def cores(self) -> int:
        return psutil.cpu_count() or 1


def process_cpu_ns(pid: int) -> int | None:
    """`pid`'s CPU time, all its threads' (those that exited too), ns: its process CPU-time clock
    (clock_getcpuclockid(3): one system call, however many threads; Linux lets any process read it). None when
    the process is gone."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | CPUCLOCK_SCHED)
    except OSError:
        return None


def engine_cpu_ns(pid: int, with_wait: bool) -> tuple[int, int | None] | None:
    """(CPU time, runqueue wait or None) of `pid`, ns, for a window's edges: the CPU time from its process clock
    (process_cpu_ns); the wait, only when asked (`with_wait`), from its threads' schedstat (threads_sched_ns: a
    file a thread, ~50 µs warm for llama-server's 11 threads, several times that with the caches cold). None when
    the process is gone."""
    ran = process_cpu_ns(pid)
    if ran is None:
        return None
    if not with_wait:
        return ran, None
    both = threads_sched_ns(pid)
    return ran, both[1] if both is not None else None


def threads_sched_ns(pid: int, max_threads: int = EDGE_THREADS_READ_MAX) -> tuple[int, int] | None:
    """(CPU time, runqueue wait) of `pid`'s threads summed, ns (/proc/PID/task/TID/schedstat, fields 1 and 2):
    counters, read cheaply (one small file a thread) at each window edge. A thread that exits between the
    listing and its read is skipped. None when the process is gone, or has more than `max_threads` threads
    (a hostile engine's thousands must not delay the pacing: its windows' run is then unknown)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    if len(tids) > max_threads:
        return None
    ran = waited = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                fields = f.read(128).split()
            ran, waited = ran + int(fields[0]), waited + int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    return ran, waited


def _descendants(root_pid: int) -> list[int] | None:
    """The descendants of `root_pid` from /proc/PID/task/TID/children (Linux: reads only the tree, where
    psutil's children() reads every process on the host: ~10 ms of CPU a call beside ~150 processes);
    None where the kernel has no such file (then psutil is asked). OSError where a file cannot be read for another
    reason than a process gone (EMFILE): the tree stays as last listed (a member read as gone and found again
    would have its whole CPU time counted twice), and the reader says why."""
    if not os.path.exists(f"/proc/{root_pid}/task/{root_pid}/children"):
        return None
    found: list[int] = []
    todo = [root_pid]
    while todo and len(found) < TREE_MAX_PROCESSES:
        kids = ProcessTree.children_of(todo.pop(), strict=True)
        found += kids
        todo += kids
    return found


class CpuMeter:
    """Cores the tree used per unit of a clock the caller passes in (µs counter): wall time for the
    busy fraction; the engine's continued time for activity (a paced engine's stopped spells must
    not dilute the reading). None until `min_span_us` of that clock has passed since the last reading."""

    def __init__(self, tree: ProcessTree, min_span_us: int = CPU_MIN_SPAN_US) -> None:
        self.tree = tree
        self.min_span_us = min_span_us
        self._base: tuple[int, float] | None = None

    def cores(self, clock_us: int) -> float | None:
        cpu = self.tree.cpu_s()
        if self._base is None:
            self._base = (clock_us, cpu)
            return None
        t0, c0 = self._base
        if clock_us - t0 < self.min_span_us:
            return None
        self._base = (clock_us, cpu)
        return max(0.0, (cpu - c0) / ((clock_us - t0) / 1e6))


def cores_of(pid: int) -> int:
    """The cores `pid` may run on (its CPU time over them is how long it ran)."""
    try:
        return len(os.sched_getaffinity(pid))
    except OSError:
        return os.cpu_count() or 1
