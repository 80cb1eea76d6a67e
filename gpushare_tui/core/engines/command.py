"""Any engine command as a supervised engine (vLLM, SGLang, TGI, a training job, ...): it runs
exactly as given, in a process group of its own (signals reach its whole tree), output to its log.
Only llama-server's command is rewritten (llama_server.prepare_args)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..host import paths
from ..host.errors import EngineError
from .spawn import die_with_parent

HOST_DEFAULT = "127.0.0.1"


@dataclass(frozen=True)
class EngineArgs:
    """An engine's command line as it is started, and where it listens: `port` None when unknown
    (a command that serves nothing, or gives no --port and has no known default)."""

    argv: tuple[str, ...]
    host: str
    port: int | None
    model: str | None
    port_chosen: bool  # we picked the port (llama-server only)
    # where the engine itself listens when a front proxy (core/engines/front_proxy.py) serves (host, port): llama-server
    # only; None: the engine serves (host, port) itself
    upstream: tuple[str, int] | None = None


def prepare(argv: Sequence[str], port: int | None = None) -> EngineArgs:
    """A command to run exactly as given; `port`: where it listens, when known."""
    if not argv:
        raise EngineError("no engine command given (use: -- COMMAND ARGS...)")
    return EngineArgs(tuple(argv), HOST_DEFAULT, port, None, False)


def display_name(args: EngineArgs) -> str:
    """A default name: the model file's stem, else the script or module a Python command runs
    (`python -m pkg.server`: pkg.server), else the program's name."""
    if args.model:
        return Path(args.model).stem
    prog = Path(args.argv[0]).name
    if prog.startswith("python") and len(args.argv) > 1:
        first = args.argv[1]
        if first == "-m" and len(args.argv) > 2:
            return args.argv[2]
        if not first.startswith("-"):
            return Path(first).stem
    return prog


def resolve_binary(argv0: str) -> str:
    path = shutil.which(argv0)
    if path is None:
        raise EngineError(f"engine binary not found: {argv0}")
    return path


def start(argv: Sequence[str], log_path: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `argv` as its own process group's leader (the group is what is paced), stdin from
    /dev/null, output appended to `log_path`. It gets SIGTERM from the kernel when the starting
    thread dies, even by SIGKILL (taken once it is continued: the watchdog, watchdog.py, continues
    and ends its whole tree), so no engine runs on unpaced and unseen after its supervisor."""
    binary = resolve_binary(argv[0])
    log = paths.open_log(log_path)  # in the state directory, never through a link
    try:
        return subprocess.Popen(
            [binary, *argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            process_group=0,
            preexec_fn=die_with_parent(signal.SIGTERM),
            close_fds=True,
        )
    except OSError as e:
        raise EngineError(f"cannot start {binary}: {e.strerror}") from None
    finally:
        os.close(log)
