"""The test run's own rules, a pytest plugin (tests/conftest.py loads it); docs/testing.md says how to use them.

- **A sandbox.** The run's XDG_RUNTIME_DIR and XDG_STATE_HOME are fresh directories under /tmp (removed at
  the end), so the control sockets and logs of the run never land in the user's own.
- **Quiet CPU.** A test marked `alone` (or listed in ALONE below) runs while no other test of the run does:
  under pytest-xdist the workers share a reader-writer lock (flock) around each test; every `alone` test is in
  one xdist group, so they run one after another on one worker, which holds the lock for all of them.
- **Module fixtures stay on one worker.** A test that uses a module- or class-scoped fixture (a real
  llama-server started once for its module) is grouped with its module (`--dist loadgroup`), so the fixture is
  started once, not once per worker.
- **Nothing left behind.** At the end the run fails when /dev/shm holds a segment (`opencoti-gpu-*`) or a named
  semaphore (`sem.*`) of its own that was not there at its start, when the user's runtime or state directory of
  gpushare-tui gained an entry of its own, or when a process the run started is still alive (every process of
  the run inherits GPUSHARE_TUI_TEST_RUN in its environment; _Tracker tells its files from other jobs').
- **Its time.** The run says its wall time, how busy the machine's CPUs were and the load average before and
  after, last.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpushare_tui.core.host.paths import APP_DIR
from gpushare_tui.core.registry import abi
from testkit.shm import SHM_DIR

RUN_ENV = "GPUSHARE_TUI_TEST_RUN"  # the run's token, inherited by every process it starts
SANDBOX_ENV = "GPUSHARE_TUI_TEST_SANDBOX"  # the run's sandbox directory (its lock files, XDG dirs)
ALONE_GROUP = "alone"
LEFTOVER_GRACE_S = 10.0  # processes ending at the run's end (xdist's workers, their last children) may take this
TRACK_EVERY_S = 0.25  # how often the process table is looked at (~1-3 ms of CPU a look)

# Tests that measure real time on the CPU (shares, rates, latencies) and fail beside other tests, or that starve
# it on purpose: they run alone. A node id prefix: a file, or a file::test. New tests say @pytest.mark.alone.
ALONE: tuple[str, ...] = (
    # four synthetic engines at nice -10 and a CPU hog for ~40 s: every other test would run starved beside it
    "tests/test_users_real.py::test_two_users_share_by_user_then_by_weight_and_a_v1_writer_forces_the_flat_split",
)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


# -- the sandbox and the run's token -----------------------------------------------------------------------


def _user_dirs() -> list[Path]:
    """The runtime and state directories gpushare-tui would use without the sandbox (and its /tmp fallback)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    dirs = [Path(f"/tmp/{APP_DIR}-{os.geteuid()}"), Path(state) / APP_DIR]
    if runtime:
        dirs.append(Path(runtime) / APP_DIR)
    return dirs


def _listing(directory: Path) -> set[str]:
    try:
        return set(os.listdir(directory))
    except OSError:
        return set()


def _shm_names() -> set[str]:
    return {n for n in _listing(Path(SHM_DIR)) if n.startswith(abi.SEGMENT_PREFIX) or n.startswith("sem.")}


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _cpu_ticks() -> tuple[int, int]:
    """(busy, all) jiffies of the machine's CPUs so far (/proc/stat)."""
    fields = [int(x) for x in (_read("/proc/stat") or b"cpu 0 0 0 0").split(b"\n")[0].split()[1:]]
    idle = sum(fields[3:5])  # idle, iowait
    return sum(fields) - idle, sum(fields)


class _Tracker(threading.Thread):
    """Watches the process table while the run lasts (every TRACK_EVERY_S): which processes are the run's
    (the token in their environment: exact) and which /dev/shm files they map or hold open. A file left at
    the end is the run's when one of its processes had it, or when its name holds one of their pids (a
    test's key `t-PID-...`, a socket `PID.sock`, a log `NAME-PID.log`): on a host where other jobs run at
    the same time, their files are told apart (and listed, not counted)."""

    def __init__(self, token: str) -> None:
        super().__init__(name="suite-tracker", daemon=True)
        self.needle = f"{RUN_ENV}={token}".encode()
        self.known: dict[int, tuple[bytes, bool]] = {}  # pid -> (its start time field, whether it is ours)
        self.pids: set[int] = set()  # every pid of the run seen
        self.shm: set[str] = set()  # /dev/shm names its processes had
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(TRACK_EVERY_S):
            self.look()

    def ours(self, pid: int) -> bool:
        stat = _read(f"/proc/{pid}/stat")
        if stat is None:
            return False
        started = stat.rsplit(b")", 1)[-1].split()[19:20]  # field 22, starttime: tells a reused pid
        key = started[0] if started else b""
        if pid not in self.known or self.known[pid][0] != key:
            env = _read(f"/proc/{pid}/environ") or b""
            self.known[pid] = (key, self.needle in env.split(b"\0"))
        return self.known[pid][1]

    def look(self) -> list[int]:
        """Record the run's live processes and their /dev/shm files; their pids."""
        live = [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != os.getpid() and self.ours(int(e))]
        for pid in live:
            self.pids.add(pid)
            maps = _read(f"/proc/{pid}/maps") or b""
            self.shm.update(
                os.path.basename(ln.split(maxsplit=5)[-1].decode(errors="replace").removesuffix(" (deleted)"))
                for ln in maps.splitlines()
                if b" /dev/shm/" in ln
            )
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith(SHM_DIR + "/"):
                    self.shm.add(os.path.basename(target))
        return live

    def made(self, name: str) -> bool:
        return name in self.shm or any(int(n) in self.pids for n in re.findall(r"\d+", name))


class _Run:
    """What the controller (or the only process) of a run keeps from its start to its end."""

    def __init__(self) -> None:
        self.started_s = time.monotonic()
        self.load_before = os.getloadavg()[0]
        self.cpu_before = _cpu_ticks()
        self.token = uuid.uuid4().hex[:12]
        self.sandbox = Path(tempfile.mkdtemp(prefix="gst-run-", dir="/tmp"))
        os.chmod(self.sandbox, 0o700)
        for name in ("runtime", "state"):
            (self.sandbox / name).mkdir(mode=0o700)
        self.user_dirs = {d: _listing(d) for d in _user_dirs()}
        self.shm = _shm_names()
        os.environ[RUN_ENV] = self.token
        os.environ[SANDBOX_ENV] = str(self.sandbox)
        os.environ["XDG_RUNTIME_DIR"] = str(self.sandbox / "runtime")
        os.environ["XDG_STATE_HOME"] = str(self.sandbox / "state")
        self.tracker = _Tracker(self.token)
        self.tracker.start()

    def leftovers(self) -> tuple[list[str], list[str]]:
        """(what the run made and did not remove, what appeared meanwhile that it cannot tell as its own)."""
        live = self.tracker.look()
        new = [f"{SHM_DIR}/{n}" for n in sorted(_shm_names() - self.shm)]
        for d, before in self.user_dirs.items():
            new += [f"{d}/{n}" for n in sorted(_listing(d) - before)]
        ours = [x for x in new if self.tracker.made(os.path.basename(x))]
        ours += [f"process {pid}: {_command_line(pid)}" for pid in live]
        return ours, [x for x in new if x not in ours]


def _command_line(pid: int) -> str:
    return (_read(f"/proc/{pid}/cmdline") or b"").replace(b"\0", b" ").decode(errors="replace").strip()[:200]


_run: _Run | None = None


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker more than the CPUs (most tests wait on processes and real time, not on a CPU)."""
    given = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if given and given.isdigit():
        return int(given)
    return len(os.sched_getaffinity(0)) + 1


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--by-file",
        action="store_true",
        help="end with a table of where the time went: per test file, its tests and their seconds (set-up, call"
        " and tear-down summed over the workers), slowest first",
    )


def pytest_configure(config: pytest.Config) -> None:
    global _run
    if not _is_worker(config) and _run is None:
        _run = _Run()


_seconds_by_file: dict[str, list[float]] = {}  # file -> [tests, seconds], on the controller (--by-file)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _seconds_by_file.setdefault(report.nodeid.split("::", 1)[0], [0, 0.0])
    entry[1] += report.duration
    if report.when == "call" or (report.when == "setup" and report.skipped):
        entry[0] += 1


def by_file_table(seconds_by_file: dict[str, list[float]]) -> list[str]:
    """The --by-file table's lines: file, tests, seconds and share of the sum, slowest first."""
    rows = sorted(seconds_by_file.items(), key=lambda kv: -kv[1][1])
    total_s = sum(s for _n, s in seconds_by_file.values()) or 1.0
    lines = [f"{'file':<48} {'tests':>5} {'seconds':>8} {'share':>6}"]
    lines += [f"{f:<48} {int(n):>5} {s:>8.1f} {100 * s / total_s:>5.1f}%" for f, (n, s) in rows]
    return lines


@pytest.hookimpl(trylast=True)  # after xdist's own: its workers are gone by then
def pytest_sessionfinish(session: pytest.Session) -> None:
    if _is_worker(session.config) or _run is None:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    _run.tracker.stop.set()
    _run.tracker.join(5)
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    left, others = _run.leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left, others = _run.leftovers()
    lines = []
    if left:
        lines += [f"the run left {len(left)} things behind (a test must remove what it makes):"]
        lines += [f"  {x}" for x in left]
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if others:
        lines += [f"{len(others)} appeared meanwhile that no process of this run had (another job's?), not counted:"]
        lines += [f"  {x}" for x in others]
    if lines and reporter is not None:
        reporter.write("\n")
        reporter.write_sep("=", "left behind", red=bool(left), yellow=not left)
        for line in lines:
            reporter.write_line(line)
    shutil.rmtree(_run.sandbox, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if _is_worker(config) or _run is None:
        return
    wall_s = time.monotonic() - _run.started_s
    busy, total = (now - then for now, then in zip(_cpu_ticks(), _run.cpu_before, strict=True))
    cpus = len(os.sched_getaffinity(0))
    if config.getoption("by_file", False) and _seconds_by_file:
        terminalreporter.write_sep("=", "where the time went, by file (test seconds summed over the workers)")
        for line in by_file_table(_seconds_by_file):
            terminalreporter.write_line(line)
    terminalreporter.write_line(
        f"test run: {wall_s:.0f} s wall; the machine's {cpus} CPUs {100 * busy / max(total, 1):.0f}% busy meanwhile;"
        f" load average {_run.load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )


# -- quiet CPU and module fixtures: markers and xdist groups ---------------------------------------------


def _wide_fixture_scope(item: pytest.Item) -> bool:
    """Whether the test uses a fixture that lives longer than a test but not the whole session."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope in ("module", "class", "package") for defs in info.name2fixturedefs.values() for d in defs)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(ALONE):
            item.add_marker(pytest.mark.alone)
        if item.get_closest_marker("alone"):
            item.add_marker(pytest.mark.xdist_group(ALONE_GROUP))
        elif _wide_fixture_scope(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


class _Room:
    """A reader-writer lock over the run's workers (flock on two files in the sandbox): a test holds the
    room shared, an `alone` test exclusively. A writer takes the turnstile first and keeps it, so readers
    that come after it wait at the turnstile rather than keep the room busy for ever."""

    def __init__(self, sandbox: str) -> None:
        self.turnstile = os.open(os.path.join(sandbox, "turnstile.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        self.room = os.open(os.path.join(sandbox, "room.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        self.exclusive = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        fcntl.flock(self.turnstile, fcntl.LOCK_EX)
        fcntl.flock(self.room, fcntl.LOCK_SH)
        fcntl.flock(self.turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self.room, fcntl.LOCK_UN)

    def enter_alone(self) -> None:
        if not self.exclusive:
            fcntl.flock(self.turnstile, fcntl.LOCK_EX)
            fcntl.flock(self.room, fcntl.LOCK_EX)
            self.exclusive = True

    def leave_alone(self) -> None:
        if self.exclusive:
            fcntl.flock(self.room, fcntl.LOCK_UN)
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)
            self.exclusive = False


_room: _Room | None = None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's: a wait here is not the test's time
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    global _room
    sandbox = os.environ.get(SANDBOX_ENV)
    if not _is_worker(item.config) or not sandbox:
        yield
        return
    if _room is None:
        _room = _Room(sandbox)
    room = _room
    if item.get_closest_marker("alone"):
        room.enter_alone()
        try:
            yield
        finally:
            if nextitem is None or not nextitem.get_closest_marker("alone"):
                room.leave_alone()
    else:
        room.leave_alone()
        with room.shared():
            yield
