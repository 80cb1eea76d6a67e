"""`gpushare-tui synth`: a synthetic engine (core/engines/synthetic.py) from the command line."""

from __future__ import annotations

import math
import os
import stat
import sys

import typer

from ..core.engines.declaration import check_class, check_name, check_step_ms, check_work_units
from ..core.engines.kinds import SYNTH_STEP_MS_DEFAULT
from ..core.host.errors import UsageError
from ..core.registry.abi import parse_weight
from .common import checked_group, resolve_key
from .options import ClassOpt, GpuIndexOpt, GpuKeyOpt, ShareGroupOpt, WeightOpt


def synth(
    weight: str = WeightOpt,
    name: str = typer.Option("synth", "--name", help="Display name in the registry."),
    gpu_key: str | None = GpuKeyOpt,
    gpu: int | None = GpuIndexOpt,
    step_ms: float = typer.Option(
        SYNTH_STEP_MS_DEFAULT,
        "--step-ms",
        help="Work per decode step, in ms at a fixed reference rate: the same work in every process, so the"
        " TOK/S of synthetic engines compare (a step takes longer or shorter on another CPU).",
    ),
    duration: float = typer.Option(0.0, "--duration", help="Seconds to run (0 = until stopped)."),
    status_file: str | None = typer.Option(None, "--status-file", help="Write JSON stats here every second."),
    no_pace: bool = typer.Option(False, "--no-pace", help="Join but never sleep (baseline)."),
    busy_idle: str | None = typer.Option(None, "--busy-idle", help="BUSY_S:IDLE_S duty pattern."),
    quiet: bool = typer.Option(
        False,
        "--quiet",
        "-q",
        help="Nothing on stdout, nothing on stderr unless it fails (a log file still records that it joined).",
    ),
    work_units: int | None = typer.Option(
        None,
        "--work-units",
        help="Work units per step instead of --step-ms's (0: calibrated to take --step-ms on this machine and"
        " its load now; engines calibrated apart do different work and their TOK/S do not compare).",
    ),
    share_group: str | None = ShareGroupOpt,
    klass: str = ClassOpt,
) -> None:
    """A synthetic engine: real CPU work per step, paced by the registry."""
    w = parse_weight(weight)
    check_name(name, label="--name")  # as `up` and the launch form: never truncated in the slot
    check_step_ms(step_ms, label="--step-ms")
    if not (math.isfinite(duration) and duration >= 0):
        raise UsageError(f"invalid --duration {duration}: a finite number of seconds >= 0 (0 = until stopped)")
    if work_units is not None:
        check_work_units(work_units, label="--work-units")
    check_class(klass, label="--class")
    if status_file is not None:
        _check_status_file(status_file)
    from ..core.engines.synthetic import serve_synth
    from ..core.registry.ownership import Owner

    pattern = _parse_pattern(busy_idle)
    key = resolve_key(gpu_key, gpu)
    serve_synth(
        key,
        w,
        name,
        share_group=checked_group(share_group),
        step_ms=step_ms,
        duration_s=duration,
        pace=not no_pace,
        pattern=pattern,
        status_file=status_file,
        report=(lambda _line: None) if quiet else None,
        **({"say": _say_to_log_only} if quiet else {}),
        units=work_units,
        owner=Owner.from_env(),
        klass=klass,
    )


def _say_to_log_only(line: str) -> None:
    """--quiet's start-up line: written when stderr is a file (an engine log: `up`, `launch` and the demo start
    synth --quiet with its output there, and `logs NAME` shows the join), never over a terminal or into a pipe."""
    try:
        to_file = stat.S_ISREG(os.fstat(2).st_mode)
    except OSError:
        return
    if to_file:
        print(line, file=sys.stderr, flush=True)


def _check_status_file(path: str) -> None:
    """UsageError unless `path` can be created: its directory exists and is writable."""
    parent = os.path.dirname(os.path.abspath(path)) if path else ""
    if not path or os.path.isdir(path):
        raise UsageError(f"invalid --status-file {path!r}: not a file name")
    if not os.path.isdir(parent):
        raise UsageError(f"invalid --status-file {path!r}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"invalid --status-file {path!r}: directory {parent} is not writable")


def _parse_pattern(text: str | None):
    """The --busy-idle duty pattern (always busy without one); UsageError if malformed."""
    from ..core.engines.synthetic import DutyPattern

    if text is None:
        return DutyPattern()
    try:
        busy_s, idle_s = (float(x) for x in text.split(":"))
        if busy_s > 0 and idle_s >= 0 and math.isfinite(busy_s + idle_s):
            return DutyPattern(busy_s, idle_s)
    except ValueError:
        pass
    raise UsageError(f"invalid --busy-idle {text!r}: use BUSY_S:IDLE_S, e.g. 3:1")
