"""Shared fixtures: unique registry keys, subprocesses that never outlive a test, the CLI.

Every test that touches /dev/shm uses its own key (removed afterwards), and every
process a test starts is killed by pid at teardown (SIGCONT first, so nothing is
ever left stopped, then SIGKILL, then reaped).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from gpushare_tui.core import abi

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
SHM_DIR = "/dev/shm"


def shm_file(key: str) -> str:
    """Path of the segment file for `key`."""
    return os.path.join(SHM_DIR, abi.SEGMENT_PREFIX + key)


def unique_key(tag: str = "t") -> str:
    return f"{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@pytest.fixture
def gpu_key() -> Iterator[str]:
    """A registry key no other test uses; its segment is removed afterwards."""
    key = unique_key()
    yield key
    _remove(shm_file(key))


@pytest.fixture
def new_gpu_key() -> Iterator[Callable[[], str]]:
    """Factory for more unique keys in one test (all removed afterwards)."""
    made: list[str] = []

    def make(tag: str = "t") -> str:
        key = unique_key(tag)
        made.append(key)
        return key

    yield make
    for key in made:
        _remove(shm_file(key))


@pytest.fixture
def shm_files() -> Iterator[Callable[[str], str]]:
    """Register extra /dev/shm file names (basename) for removal at teardown; returns the path."""
    made: list[str] = []

    def register(basename: str) -> str:
        path = os.path.join(SHM_DIR, basename)
        made.append(path)
        return path

    yield register
    for path in made:
        _remove(path)


class Procs:
    """Starts subprocesses and guarantees none survives the test (kill by pid)."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, argv: Sequence[str], **kw: object) -> subprocess.Popen:
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        p = subprocess.Popen(list(argv), **kw)  # type: ignore[call-overload]
        self.started.append(p)
        return p

    @staticmethod
    def kill(p: subprocess.Popen) -> None:
        if p.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(p.pid, sig)
                except ProcessLookupError:
                    break
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            pass
        for f in (p.stdout, p.stderr, p.stdin):
            if f is not None:
                f.close()

    def kill_all(self) -> None:
        for p in self.started:
            self.kill(p)


@pytest.fixture
def procs() -> Iterator[Procs]:
    ps = Procs()
    try:
        yield ps
    finally:
        ps.kill_all()


def cli_argv(*args: str) -> list[str]:
    """argv that runs the gpushare-tui CLI with this interpreter."""
    return [sys.executable, "-m", "gpushare_tui", *args]


# atexit runs after threading's shutdown (non-daemon threads joined), just before finalization: a
# (daemon) thread still running then races exit() itself. A supervisor's monitor thread caught inside
# OpenSSL there (httpx.Client loading the CA store) crashed it with SIGSEGV/SIGABRT in OPENSSL_cleanup.
_THREADS_AT_EXIT = (
    "import atexit, runpy, sys, threading\n"
    "atexit.register(lambda: print('threads at exit:', sorted(t.name for t in threading.enumerate()"
    " if t is not threading.main_thread()), file=sys.stderr, flush=True))\n"
    "runpy.run_module('gpushare_tui', run_name='__main__', alter_sys=True)\n"
)


def cli_argv_threads_at_exit(*args: str) -> list[str]:
    """cli_argv, but the process says on stderr, last, `threads at exit: [names]`: its threads
    other than the main one still alive when it exits (an orderly exit leaves none: `[]`)."""
    return [sys.executable, "-c", _THREADS_AT_EXIT, *args]


def run_cli(*args: str, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(cli_argv(*args), capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess]:
    """cli("--once", "--json") -> CompletedProcess (stdout/stderr text)."""
    return run_cli


@pytest.fixture
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A private, short XDG_RUNTIME_DIR (control sockets) inherited by subprocesses."""
    base = tempfile.mkdtemp(prefix="gst-", dir="/tmp")
    os.chmod(base, 0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", base)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def wait_for(pred: Callable[[], object], timeout: float, interval: float = 0.02, what: str = "condition") -> object:
    """Poll `pred` until truthy; fail the test with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def read_json_file(path: str | os.PathLike) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


OTHER_UID = OTHER_GID = 65534  # nobody / nogroup: the hostile local user
SYSTEM_PYTHON = "/usr/bin/python3"  # the venv's interpreter may live where uid 65534 cannot read


def _can_play_other_user() -> str | None:
    """Why the hostile-user tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root: the attacker's steps run as uid 65534"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} not found (the attacker's interpreter)"
    return None


@pytest.fixture
def other_user() -> Callable[..., subprocess.CompletedProcess]:
    """other_user(code, *args) runs Python `code` as uid/gid 65534 (stdlib only; argv in sys.argv[1:]).
    Skips the test when not root."""
    why = _can_play_other_user()
    if why:
        pytest.skip(why)

    def run(code: str, *args: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(
            [SYSTEM_PYTHON, "-I", "-c", code, *args],
            user=OTHER_UID,
            group=OTHER_GID,
            extra_groups=[],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and r.returncode != 0:
            pytest.fail(f"attacker step failed (rc {r.returncode}): {r.stderr.strip()}")
        return r

    return run
