"""`status`, `weight`, `class`, `stop`: requests to a managed engine's control socket (core/pacing/control.py).

The engine is named by its pid or by its name (cli/common.engine_ref: one resolver for every
command). A busy reply (every worker of the engine's socket held, e.g. by a flood of idle
connections) is retried for up to budgets.CONTROL_BUSY_RETRY_S. A pid that serves several engines
(several GpuShare in one process) needs `--slot` (and `--gpu-key` when slots repeat across keys)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

from ..core.engines.declaration import LATENCY_CLASSES, check_class
from ..core.host import budgets
from ..core.host.errors import GpushareError
from ..core.registry.abi import WEIGHT_RULE, parse_weight
from .common import engine_ref
from .options import EngineArg, EngineKeyOpt, EngineSlotOpt

if TYPE_CHECKING:
    from ..core.pacing.control import StatusReply
    from ..core.pacing.edges import EdgeReport

# a negative weight ("weight PID -1") is a value to reject, not an unknown option
VALUE_CONTEXT = {"ignore_unknown_options": True}


def _ask(engine: str, cmd: str, slot: int | None, gpu_key: str | None, **args: object) -> tuple[int, dict]:
    """(the engine's pid, its reply to `cmd`)."""
    from ..core.pacing.control import request

    ref = engine_ref(engine, slot, gpu_key)
    reply = request(ref.pid, cmd, 3.0, target=ref.target, busy_retry_s=budgets.CONTROL_BUSY_RETRY_S, **args)
    return ref.pid, reply


def status(
    engine: str = EngineArg,
    as_json: bool = typer.Option(False, "--json", help='Print one JSON object (on failure {"ok": false, ...}).'),
    slot: int | None = EngineSlotOpt,
    gpu_key: str | None = EngineKeyOpt,
) -> None:
    """Show a managed engine's status (fields it does not know are left out)."""
    from ..core.pacing.control import StatusReply

    try:
        typed = StatusReply.from_json(_ask(engine, "status", slot, gpu_key)[1])
    except GpushareError as e:
        if as_json:
            print(json.dumps({"ok": False, "error": str(e)}))
        raise
    reply = typed.to_json()
    if as_json:
        print(json.dumps(reply))
    else:
        for k, v in reply.items():
            if v is not None:
                print(f"{k:>10}: {_status_value(typed, k, v)}")


def _status_value(reply: StatusReply, key: str, value: object) -> str:
    """One `status` field for a person: a float to 2 places, the nested ones in words (untrusted text printable)."""
    from ..core.host.text import printable

    if key == "latency" and reply.latency is not None:
        from ..dashboard.columns import latency_text

        return printable(latency_text(reply.latency))
    if key == "slo" and reply.slo is not None:
        from ..dashboard.columns import slo_text

        return printable(slo_text(reply.slo))
    if key == "edges" and reply.edges is not None:
        return edges_text(reply.edges)
    if isinstance(value, dict):  # signal_lateness
        return lateness_text(value)
    return f"{value:.2f}" if isinstance(value, float) else printable(str(value))


# What signal lateness is, where none was measured: a status reader otherwise takes n=0 for a fault
LATENESS_NONE_WHY = "measured each time the engine is paused for a peer; alone or idle it never is"


def lateness_text(lateness: dict) -> str:
    """`p50 0.3 ms, p99 1.2 ms, max 4 ms (n=123)` (µs fields as ms); none yet: `none measured yet (n=0: ...)`,
    which says when there will be some (at each pause for a peer: an engine alone or idle has none)."""
    n = lateness.get("n")
    shown = [(label, lateness.get(f"{label}_us")) for label in ("p50", "p99", "max")]
    parts = [f"{label} {_ms(us)} ms" for label, us in shown if isinstance(us, int | float)]
    if not parts:
        return f"none measured yet (n={n if n is not None else '?'}: {LATENESS_NONE_WHY})"
    return f"{', '.join(parts)} (n={n if n is not None else '?'})"


def edges_text(r: EdgeReport) -> str:
    """`last 60 s: 750 windows of 40 ms mean, signals late p50 0.1 ms p99 0.9 ms, ran 93.1% of scheduled, loss
    1.4 ms per edge, waited 2.0%` (the parts known); none yet: says when there will be some."""
    if not r.windows:
        return f"no window in the last {r.span_s or 60:g} s ({LATENESS_NONE_WHY})"
    parts = [f"last {r.span_s or 60:g} s: {r.windows} windows"]
    if r.scheduled_ms_mean is not None:
        parts[0] += f" of {r.scheduled_ms_mean:.3g} ms mean"
    if r.lateness_p50_us is not None and r.lateness_p99_us is not None:
        parts.append(f"signals late p50 {_ms(r.lateness_p50_us)} ms p99 {_ms(r.lateness_p99_us)} ms")
    if r.ran_pct is not None:
        parts.append(f"ran {r.ran_pct:.1f}% of scheduled")
    if r.loss_per_edge_ms is not None:
        parts.append(f"loss {r.loss_per_edge_ms:.2f} ms per edge")
    if r.waited_pct is not None:
        parts.append(f"waited for a core {r.waited_pct:.1f}%")
    return ", ".join(parts)


def _ms(us: float) -> str:
    ms = us / 1000
    return f"{ms:.3g}" if abs(ms) < 1000 else f"{ms:.0f}"


def weight(
    engine: str = EngineArg,
    value: str = typer.Argument(..., help=f"New weight: {WEIGHT_RULE.removeprefix('must be ')}."),
    slot: int | None = EngineSlotOpt,
    gpu_key: str | None = EngineKeyOpt,
) -> None:
    """Change a managed engine's weight."""
    w = parse_weight(value)  # before the engine is looked up: a bad value is a usage error either way
    pid, reply = _ask(engine, "set_weight", slot, gpu_key, weight=w)
    print(f"engine {pid}: weight {reply['weight']:g}")


def klass(
    engine: str = EngineArg,
    value: str = typer.Argument(..., metavar="CLASS", help=f"New latency class: {' or '.join(LATENCY_CLASSES)}."),
    slot: int | None = EngineSlotOpt,
    gpu_key: str | None = EngineKeyOpt,
) -> None:
    """Change a managed engine's latency class (interactive runs first, within its weight share)."""
    cls = check_class(value, label="class")  # before the engine is looked up, as weight's value
    pid, reply = _ask(engine, "set_class", slot, gpu_key, **{"class": cls})
    print(f"engine {pid}: class {reply['class']}")


def stop(
    engine: str = EngineArg,
    wait: float = typer.Option(15.0, "--wait", help="Seconds to wait for the engine to exit."),
    slot: int | None = EngineSlotOpt,
    gpu_key: str | None = EngineKeyOpt,
) -> None:
    """Stop a managed engine (SIGCONT, SIGTERM, SIGKILL after 10 s) and leave its slot."""
    import psutil

    pid, _reply = _ask(engine, "stop", slot, gpu_key)
    try:
        psutil.Process(pid).wait(wait)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        raise GpushareError(f"engine {pid} still running after {wait:g} s") from None
    print(f"engine {pid}: stopped")
