"""How an engine kind's command is prepared and started, by its record (core/engines/kinds.py): a kind
that `rewrites_command` (llama-server) gets its port, host, --metrics and --slots from us and is started
once its ports are known free; any other runs exactly as given. The records import nothing of the
package; this module joins them to the code that starts a command."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from . import command
from . import llama_server as ls
from .command import EngineArgs
from .kinds import EngineKind


def prepare(kind: EngineKind, argv: Sequence[str], port: int | None, *, proxy: bool = True) -> EngineArgs:
    """The command as it is started; `port`: where an unrewritten one listens, when known."""
    return ls.prepare_args(list(argv), proxy=proxy) if kind.rewrites_command else command.prepare(argv, port)


def start(kind: EngineKind, args: EngineArgs, log_path: str) -> subprocess.Popen:
    """Start the prepared command, its output to `log_path`."""
    return ls.start(args, log_path) if kind.rewrites_command else command.start(args.argv, log_path)
