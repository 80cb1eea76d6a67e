"""`status`, `weight`, `stop`: requests to a managed engine's control socket (core/control.py)."""

from __future__ import annotations

import json

import typer

from ..core.abi import parse_weight
from ..core.errors import GpushareError

PidArg = typer.Argument(..., help="Engine pid.")
# a negative weight ("weight PID -1") is a value to reject, not an unknown option
VALUE_CONTEXT = {"ignore_unknown_options": True}


def status(
    pid: int = PidArg,
    as_json: bool = typer.Option(False, "--json", help='Print one JSON object (on failure {"ok": false, ...}).'),
) -> None:
    """Show a managed engine's status (fields it does not know are left out)."""
    from ..core.control import StatusReply, request

    try:
        reply = StatusReply.from_json(request(pid, "status")).to_json()
    except GpushareError as e:
        if as_json:
            print(json.dumps({"ok": False, "error": str(e)}))
        raise
    if as_json:
        print(json.dumps(reply))
    else:
        for k, v in reply.items():
            if v is not None:
                print(f"{k:>10}: {v:.2f}" if isinstance(v, float) else f"{k:>10}: {v}")


def weight(pid: int = PidArg, value: str = typer.Argument(..., help="New weight (finite, > 0).")) -> None:
    """Change a managed engine's weight."""
    from ..core.control import request

    reply = request(pid, "set_weight", weight=parse_weight(value))
    print(f"engine {pid}: weight {reply['weight']:g}")


def stop(
    pid: int = PidArg,
    wait: float = typer.Option(15.0, "--wait", help="Seconds to wait for the engine to exit."),
) -> None:
    """Stop a managed engine (SIGCONT, SIGTERM, SIGKILL after 10 s) and leave its slot."""
    import psutil

    from ..core.control import request

    request(pid, "stop")
    try:
        psutil.Process(pid).wait(wait)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        raise GpushareError(f"engine {pid} still running after {wait:g} s") from None
    print(f"engine {pid}: stopped")
