"""Real llama-server helpers: finding the binary (built and cached by scripts/install-llama-server.sh),
supervisors started by a test, engine pids. No mock stands in for llama-server."""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import signal
import subprocess

import pytest

from gpushare_tui.core.registry.segment import Segment, shm_path
from testkit.cli import cli_argv
from testkit.paths import REPO
from testkit.wait import wait_for

INSTALL = REPO / "scripts" / "install-llama-server.sh"


@functools.cache
def find_llama_server() -> tuple[str | None, str]:
    """(path, "") of the llama-server to test with, or (None, why there is none). Builds nothing."""
    given = os.environ.get("LLAMA_SERVER")
    if given:
        return (given, "") if os.access(given, os.X_OK) else (None, f"LLAMA_SERVER={given} is not an executable")
    found = shutil.which("llama-server")
    if found:
        return found, ""
    out = subprocess.run(["bash", str(INSTALL), "--cached"], capture_output=True, text=True, timeout=60)
    if out.returncode == 0:
        return out.stdout.strip().splitlines()[-1], ""
    why = out.stderr.strip().removeprefix("install-llama-server: ") or f"{INSTALL.name} --cached: exit {out.returncode}"
    return None, f"llama-server not provisioned (LLAMA_SERVER unset, none on PATH, {why}): scripts/test.sh builds it"


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


class Engines:
    """Supervisors (`gpushare-tui run`) started by a test and their engines; all ended at teardown.
    An engine's pid comes from the supervisor's ready notice (--notify-fd), as `launch` reads it."""

    def __init__(self, procs, key: str, server: str, model: str) -> None:
        self.procs, self.key, self.server, self.model = procs, key, server, model
        self.engine_pids: list[int] = []

    def run(
        self,
        weight: float = 1.0,
        *extra_engine: str,
        name: str | None = None,
        threads: int = 1,
        python: list[str] | None = None,
        options: tuple[str, ...] = (),
        popen: dict | None = None,
    ):
        """(supervisor, engine pid, its join line). `python`: the CLI's argv before its arguments,
        instead of `python -m gpushare_tui`; `options`: more of `run`'s (before the `--`); `popen`:
        more of Popen's keywords (a `preexec_fn`)."""
        notice_r, notice_w = os.pipe2(os.O_CLOEXEC)
        argv = [*python, "run"] if python else cli_argv("run")
        argv += ["--weight", str(weight), "--gpu-key", self.key, "--notify-fd", str(notice_w)]
        if name:
            argv += ["--name", name]
        argv += [*options, "--", self.server, "-m", self.model, "-t", str(threads), "-c", "4096", "-np", "1"]
        argv += extra_engine
        try:
            sup = self.procs.start(argv, pass_fds=(notice_w,), **(popen or {}))
        finally:
            os.close(notice_w)
        with os.fdopen(notice_r, "rb") as pipe:
            line = wait_for(lambda: read_join_line(sup), 60, what="supervisor join line")
            notice = _read_notice(sup, pipe, 60)
        pid = int(notice["engine_pid"])
        self.engine_pids.append(pid)
        return sup, pid, line

    def slot_of(self, pid: int):
        with Segment.attach_readonly(shm_path(self.key)) as seg:
            return next((r for r in seg.read_slots() if r.pid == pid), None)

    def end(self) -> None:
        for pid in self.engine_pids:
            end_pid(pid)


def read_join_line(sup) -> str | None:
    if sup.poll() is not None:
        pytest.fail(f"supervisor exited {sup.returncode}: {sup.stderr.read()}")
    line = sup.stderr.readline()
    return line if "joined" in line else None


def _read_notice(sup, pipe, timeout_s: float) -> dict:
    """The supervisor's ready notice: one JSON line on the --notify-fd pipe."""
    if not select.select([pipe], [], [], timeout_s)[0]:
        pytest.fail(f"no ready notice from supervisor {sup.pid} after {timeout_s}s")
    raw = pipe.readline()
    notice = json.loads(raw) if raw.strip() else None
    if not isinstance(notice, dict) or not notice.get("ok"):
        pytest.fail(f"supervisor {sup.pid} sent no ready notice ({raw!r}): {sup.stderr.read()}")
    return notice
