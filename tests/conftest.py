"""Shared fixtures: unique registry keys, subprocesses that never outlive a test, the CLI, a real
llama-server and a tiny model. The helpers behind them live in testkit/.

Every test that touches /dev/shm uses its own key (removed afterwards), and every
process a test starts is killed by pid at teardown (SIGCONT first, so nothing is
ever left stopped, then SIGKILL, then reaped).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator

import pytest
from llama_env import find_llama_server

from testkit.cli import run_cli
from testkit.other_user import OTHER_GID, OTHER_UID, SYSTEM_PYTHON, why_not_other_user
from testkit.procs import Procs
from testkit.shm import SHM_DIR, remove, shm_file, unique_key

pytest_plugins = ("testkit.suite",)  # the run's sandbox, quiet-CPU lock and leftover check (docs/testing.md)


@pytest.fixture(autouse=True)
def _normal_scheduling_after() -> Iterator[None]:
    """A test that leaves the test process's thread at another scheduling policy (a pace loop's SCHED_FIFO) errs,
    and the policy is put back: every process later tests start from it would inherit it, and two busy ones at
    SCHED_FIFO take both cores from every normal task and every pacing thread."""
    yield
    policy = os.sched_getscheduler(0)
    if policy != os.SCHED_OTHER:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        pytest.fail(f"the test left this thread at scheduling policy {policy:#x}, not SCHED_OTHER")


@pytest.fixture
def gpu_key() -> Iterator[str]:
    """A registry key no other test uses; its segment is removed afterwards."""
    key = unique_key()
    yield key
    remove(shm_file(key))


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
        remove(shm_file(key))


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
        remove(path)


@pytest.fixture
def procs() -> Iterator[Procs]:
    ps = Procs()
    try:
        yield ps
    finally:
        ps.kill_all()


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


@pytest.fixture
def other_user() -> Callable[..., subprocess.CompletedProcess]:
    """other_user(code, *args) runs Python `code` as uid/gid 65534 (stdlib only; argv in sys.argv[1:]).
    Skips the test when not root."""
    why = why_not_other_user()
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


def pytest_collection_finish(session: pytest.Session) -> None:
    """Say up front which llama-server the llama tests use, or why they skip."""
    if any(item.get_closest_marker("llama") for item in session.items):
        path, why = find_llama_server()
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"llama-server: {path}" if path else f"{why}; the llama tests skip")


@pytest.fixture(scope="session")
def llama_server() -> str:
    """The llama-server binary ($LLAMA_SERVER, on PATH, or cached by scripts/install-llama-server.sh).
    Never builds one (a build takes 6-26 min, far past a test's timeout): skips when none is
    provisioned (scripts/test.sh builds it first), fails when $LLAMA_SERVER names no executable."""
    path, why = find_llama_server()
    if path is None:
        (pytest.fail if os.environ.get("LLAMA_SERVER") else pytest.skip)(why)
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from testkit.tiny_gguf import write_tiny_llama

    return write_tiny_llama(str(tmp_path_factory.mktemp("models") / "tiny-llama.gguf"), 256, 4)
