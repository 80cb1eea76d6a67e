"""The gpushare-tui command line run by tests, with this interpreter."""

from __future__ import annotations

import subprocess
import sys


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


def status_json(pid: int) -> dict:
    """What `gpushare-tui status PID --json` prints, asked from this process over the engine's control socket:
    for a test about the engine's reply, not the CLI's start-up (which costs ~0.5 s of CPU a call)."""
    from gpushare_tui.core.pacing import control

    return control.StatusReply.from_json(control.request(pid, "status")).to_json()


def run_cli_here(*args: str) -> subprocess.CompletedProcess:
    """The CLI run in this process (`gpushare_tui.cli.main`), its stdout and stderr captured: for a test of what a
    command says and returns, not of its start-up (a process costs ~0.5 s of CPU). Keep one real process per
    such test (run_cli) for the start-up's part: the signal guard, the imports, the exit status itself."""
    import contextlib
    import io

    from gpushare_tui.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(["gpushare-tui", *args], code, out.getvalue(), err.getvalue())
