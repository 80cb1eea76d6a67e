"""Command line (typer). The `--once` path must not import Textual.

Exit codes: 0 ok, 1 runtime error, 2 usage error (bad weight, key or option).
"""

from __future__ import annotations

import enum
import json
import math
import os
import sys
from typing import NoReturn

import typer

from .core import abi

app = typer.Typer(
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Share one GPU fairly between LLM servers, and watch it.\n\nExit codes: 0 ok, 1 runtime error, 2 usage error.",
)


class ExitCode(enum.IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2


def fail(msg: str, code: ExitCode = ExitCode.ERROR) -> NoReturn:
    """One clear line on stderr, then exit."""
    print(f"gpushare-tui: {msg}", file=sys.stderr, flush=True)
    raise typer.Exit(int(code))


def checked_key(key: str | None) -> str | None:
    if key is None:
        return None
    try:
        return abi.validate_gpu_key(key)
    except abi.BadKeyError as e:
        fail(str(e), ExitCode.USAGE)


def checked_weight(weight: str) -> float:
    try:
        return abi.parse_weight(weight)
    except abi.BadWeightError as e:
        fail(str(e), ExitCode.USAGE)


def resolve_key(gpu_key: str | None, gpu: int | None) -> str:
    """--gpu-key wins; else the NVML UUID of --gpu (default 0)."""
    if gpu_key is not None:
        return checked_key(gpu_key)  # type: ignore[return-value]
    from .core.gpu import GpuKeyError, gpu_key_for_index

    try:
        return gpu_key_for_index(gpu or 0)
    except GpuKeyError as e:
        fail(str(e))


def checked_group(group: str | None) -> str | None:
    """A --share-group that names a group here (or a numeric gid), else a usage error."""
    if group is None:
        return None
    from .core.segment import UnknownGroupError, resolve_group

    try:
        resolve_group(group)
    except UnknownGroupError as e:
        fail(str(e), ExitCode.USAGE)
    return group


GpuKeyOpt = typer.Option(None, "--gpu-key", help="Registry key (overrides --gpu); 1..64 of [A-Za-z0-9._-].")
GpuIndexOpt = typer.Option(None, "--gpu", help="CUDA device index whose NVML UUID is the key (default 0).")
ShareGroupOpt = typer.Option(
    None,
    "--share-group",
    envvar="GPUSHARE_GROUP",
    help="Share the segment with this group: create it 0660 for the group, join the group's (never world-writable).",
)


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _age(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.0f}"


def render_table(report: dict) -> str:
    """The human-readable `--once` table. Names, keys and errors are untrusted: control characters never
    reach the terminal (the JSON form keeps them, escaped)."""
    from .core.text import printable

    lines = []
    for g in report["gpus"]:
        period = f"{g['period_ms']} ms" if g["period_ms"] is not None else "none (unthrottled)"
        warn = "  WARNING: group/world-writable" if g["writable_by_others"] else ""
        lines.append(
            f"{printable(g['segment'])}  owner {printable(g['owner'])}  mode {g['mode']}  "
            f"period {period}  peers {len(g['peers'])}{warn}"
        )
        lines.append(
            f"  {'SLOT':>4} {'PID':>8} {'NAME':<20} {'WEIGHT':>7} {'SHARE%':>7} {'BUSY%':>6} "
            f"{'ACTIVE':<6} {'ALIVE':<5} {'HB_MS':>7}  WINDOW_US"
        )
        for p in g["peers"]:
            win = f"[{p['window_us'][0]}, {p['window_us'][1]})" if p["window_us"] else "-"
            lines.append(
                f"  {p['slot']:>4} {p['pid']:>8} {printable(p['name'])[:20]:<20} {_fmt(p['weight'], '.3g'):>7} "
                f"{p['share_pct']:>7.1f} {p['busy_pct']:>6.1f} {'yes' if p['active'] else 'no':<6} "
                f"{'yes' if p['alive'] else 'no':<5} {_age(p['heartbeat_age_ms']):>7}  {win}"
            )
    for e in report["errors"]:
        lines.append(f"error: {printable(e['segment'])}: {printable(e['error'])}")
    if not report["gpus"] and not report["errors"]:
        lines.append("no /opencoti-gpu-* segments on this host")
    return "\n".join(lines)


def once_report(gpu_key: str | None) -> dict:
    from .core.clock import wall_us
    from .core.snapshot import SegmentReader, report_to_json

    reader = SegmentReader(gpu_key)
    try:
        now = wall_us()
        gpus, errors = reader.read(now)
        return report_to_json(gpus, errors, now)
    finally:
        reader.close()


@app.callback(invoke_without_command=True)
def main(
    ctx: typer.Context,
    once: bool = typer.Option(False, "--once", help="Print one snapshot of every segment and exit."),
    as_json: bool = typer.Option(False, "--json", help="With --once: one JSON object."),
    gpu_key: str | None = typer.Option(None, "--gpu-key", help="Show only this segment."),
    interval: float = typer.Option(1.0, "--interval", help="Dashboard refresh in seconds (min 0.2)."),
    readonly: bool = typer.Option(False, "--readonly", help="Dashboard: disable every admin action."),
) -> None:
    """Open the dashboard, or with --once print a snapshot."""
    if ctx.invoked_subcommand is not None:
        return
    key = checked_key(gpu_key)
    if as_json and not once:
        fail("--json needs --once", ExitCode.USAGE)
    if once:
        report = once_report(key)
        print(json.dumps(report, allow_nan=False) if as_json else render_table(report))
        raise typer.Exit(0)
    if not math.isfinite(interval) or interval < 0.2:
        fail(f"invalid --interval {interval}: at least 0.2 seconds", ExitCode.USAGE)
    from .app import run_dashboard

    run_dashboard(gpu_key=key, interval_s=interval, readonly=readonly)


@app.command()
def synth(
    weight: str = typer.Option(..., "--weight", help="Share weight (finite, > 0)."),
    name: str = typer.Option("synth", "--name"),
    gpu_key: str | None = GpuKeyOpt,
    gpu: int | None = GpuIndexOpt,
    step_ms: float = typer.Option(5.0, "--step-ms", help="CPU work per decode step, in ms (unpaced)."),
    duration: float = typer.Option(0.0, "--duration", help="Seconds to run (0 = until stopped)."),
    status_file: str | None = typer.Option(None, "--status-file", help="Write JSON stats here every second."),
    no_pace: bool = typer.Option(False, "--no-pace", help="Join but never sleep (baseline)."),
    busy_idle: str | None = typer.Option(None, "--busy-idle", help="BUSY_S:IDLE_S duty pattern."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No per-second lines on stdout."),
    work_units: int = typer.Option(0, "--work-units", help="Fixed work per step (0 = calibrate to --step-ms)."),
    share_group: str | None = ShareGroupOpt,
) -> None:
    """A synthetic engine: real CPU work per step, paced by the registry."""
    w = checked_weight(weight)
    if not (math.isfinite(step_ms) and 0.05 <= step_ms <= 10_000):
        fail(f"invalid --step-ms {step_ms}: between 0.05 and 10000", ExitCode.USAGE)
    if not (math.isfinite(duration) and duration >= 0):
        fail(f"invalid --duration {duration}: a finite number of seconds >= 0 (0 = until stopped)", ExitCode.USAGE)
    if work_units < 0:
        fail(f"invalid --work-units {work_units}: >= 0 (0 = calibrate to --step-ms)", ExitCode.USAGE)
    if status_file is not None:
        _check_status_file(status_file)
    pattern = _parse_pattern(busy_idle)
    key = resolve_key(gpu_key, gpu)
    share_group = checked_group(share_group)
    from .core.engines.synthetic import serve_synth
    from .core.errors import GpushareError

    try:
        serve_synth(
            key,
            w,
            name,
            share_group=share_group,
            step_ms=step_ms,
            duration_s=duration,
            pace=not no_pace,
            pattern=pattern,
            status_file=status_file,
            report=(lambda _l: None) if quiet else None,
            units=work_units or None,
        )
    except GpushareError as e:
        fail(str(e))


def _check_status_file(path: str) -> None:
    """Fail (usage) unless `path` can be created: its directory exists and is writable."""
    parent = os.path.dirname(os.path.abspath(path)) if path else ""
    if not path or os.path.isdir(path):
        fail(f"invalid --status-file {path!r}: not a file name", ExitCode.USAGE)
    if not os.path.isdir(parent):
        fail(f"invalid --status-file {path!r}: directory {parent} does not exist", ExitCode.USAGE)
    if not os.access(parent, os.W_OK | os.X_OK):
        fail(f"invalid --status-file {path!r}: directory {parent} is not writable", ExitCode.USAGE)


def _parse_pattern(text: str | None):
    from .core.engines.synthetic import DutyPattern

    if text is None:
        return DutyPattern()
    try:
        busy_s, idle_s = (float(x) for x in text.split(":"))
        if busy_s > 0 and idle_s >= 0 and math.isfinite(busy_s + idle_s):
            return DutyPattern(busy_s, idle_s)
    except ValueError:
        pass
    fail(f"invalid --busy-idle {text!r}: use BUSY_S:IDLE_S, e.g. 3:1", ExitCode.USAGE)


@app.command()
def demo(
    interval: float = typer.Option(1.0, "--interval", help="Dashboard refresh in seconds (min 0.2)."),
    readonly: bool = typer.Option(False, "--readonly", help="Disable every admin action."),
    gpu_key: str | None = typer.Option(None, "--gpu-key", help="Demo segment key (default demo-<pid>)."),
    history: float = typer.Option(120.0, "--history", help="Seconds of history in the plots."),
) -> None:
    """Try it without a GPU: three synthetic engines (weights 2/1/1) and the dashboard on them."""
    key = checked_key(gpu_key)
    if not math.isfinite(interval) or interval < 0.2:
        fail(f"invalid --interval {interval}: at least 0.2 seconds", ExitCode.USAGE)
    if not math.isfinite(history) or history < 10:
        fail(f"invalid --history {history}: at least 10 seconds", ExitCode.USAGE)
    from .demo import run_demo

    raise typer.Exit(run_demo(interval_s=interval, readonly=readonly, key=key, history_s=history))


def entrypoint() -> None:
    """Console script: usage errors become one line on stderr (exit 2), never a panel or traceback."""
    # click's (or typer's vendored click's) exception classes, whichever this typer uses
    mro = typer.BadParameter.__mro__
    usage_error = next(c for c in mro if c.__name__ == "UsageError")
    click_exception = next(c for c in mro if c.__name__ == "ClickException")
    try:
        code = app(standalone_mode=False)
    except usage_error as e:
        sub = e.ctx.info_name if e.ctx is not None and e.ctx.parent is not None else ""  # type: ignore[attr-defined]
        print(
            f"gpushare-tui: {e.format_message()} (see: gpushare-tui {sub + ' ' if sub else ''}--help)", file=sys.stderr
        )
        sys.exit(int(ExitCode.USAGE))
    except typer.Abort:
        sys.exit(130)
    except click_exception as e:
        print(f"gpushare-tui: {e.format_message()}", file=sys.stderr)
        sys.exit(e.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


from . import engine_cli  # noqa: E402,F401  (registers run/launch/status/weight/stop)
