"""Real llama-server fixtures: the binary (built and cached by scripts/install-llama-server.sh)
and a tiny random-weights GGUF. No mock stands in for llama-server."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def find_llama_server() -> str:
    found = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    if found:
        return found
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "install-llama-server.sh")], capture_output=True, text=True, timeout=3600
    )
    if out.returncode != 0:
        pytest.fail(f"could not install llama-server: {out.stderr[-2000:]}")
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def llama_server() -> str:
    return find_llama_server()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from testkit.tiny_gguf import write_tiny_llama

    return write_tiny_llama(str(tmp_path_factory.mktemp("models") / "tiny-llama.gguf"), 256, 4)


def proc_state(pid: int) -> str | None:
    """Kernel state letter of `pid` (R, S, T, Z...), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def end_pid(pid: int) -> None:
    """SIGCONT then SIGKILL a pid we started indirectly (an engine)."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
