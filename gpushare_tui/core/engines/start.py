"""How an engine kind's command is prepared and started, by its record (core/engines/kinds.py): a kind
that `rewrites_command` (llama-server) gets its port, host, --metrics and --slots from us and is started
once its ports are known free; an HTTP engine whose port is known is moved to an internal port behind the
front proxy (fronted.py); any other runs exactly as given. The records import nothing of the
package; this module joins them to the code that starts a command."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from . import command
from . import llama_server as ls
from .command import EngineArgs
from .declaration import EngineSources
from .fronted import fronted_args
from .kinds import EngineKind


def prepare(
    kind: EngineKind, argv: Sequence[str], sources: EngineSources, *, proxy: bool = True
) -> tuple[EngineArgs, EngineSources]:
    """The command as it is started, and its sources: llama-server's rewritten; an HTTP engine whose port is
    known fronted by the proxy (fronted.py: its readiness and metrics URLs moved to where it listens);
    else as given."""
    if kind.rewrites_command:
        return ls.prepare_args(list(argv), proxy=proxy), sources
    return fronted_args(list(argv), sources, proxy=proxy)


def start(kind: EngineKind, args: EngineArgs, log_path: str) -> subprocess.Popen:
    """Start the prepared command, its output to `log_path`."""
    return ls.start(args, log_path) if kind.rewrites_command else command.start(args.argv, log_path)
