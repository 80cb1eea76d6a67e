"""The root command: the dashboard, or with --once a snapshot (cli/once.py)."""

from __future__ import annotations

import typer

from ..core.host.errors import UsageError
from .common import checked_interval, checked_key
from .once import ONCE_EXIT_RULE, print_once
from .options import AllOwnersOpt, IntervalOpt, ReadonlyOpt


def _show_version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"gpushare-tui {__version__}")
        raise typer.Exit(0)


def dashboard(
    ctx: typer.Context,
    once: bool = typer.Option(False, "--once", help=f"Print one snapshot of every segment and exit. {ONCE_EXIT_RULE}"),
    as_json: bool = typer.Option(False, "--json", help="With --once: one JSON object."),
    gpu_key: str | None = typer.Option(None, "--gpu-key", help="Show only this segment."),
    interval: float = IntervalOpt,
    readonly: bool = ReadonlyOpt,
    remote: list[str] = typer.Option(
        [],
        "--remote",
        metavar="URL",
        help="Also show the segments of the host whose `gpushare-tui serve` is at this URL (repeat).",
    ),
    no_local: bool = typer.Option(False, "--no-local", help="With --remote: leave out this host's segments."),
    fmt: str | None = typer.Option(None, "--format", help="With --once: table, json or prometheus."),
    show_idle: bool = typer.Option(
        False,
        "--all",
        help="With --once: also list segments with no live peers (hidden by default; `gc` removes our own).",
    ),
    all_owners: bool = AllOwnersOpt,
    version: bool = typer.Option(
        False, "--version", "-V", help="Print the version and exit.", is_eager=True, callback=_show_version
    ),
) -> None:
    """Open the dashboard, or with --once print a snapshot."""
    if ctx.invoked_subcommand is not None:
        return
    key = checked_key(gpu_key)
    if as_json and not once:
        raise UsageError("--json needs --once")
    if fmt is not None and not once:
        raise UsageError("--format needs --once")
    if once:
        raise typer.Exit(print_once(key, as_json, remote, not no_local, fmt, show_idle, all_owners))
    if no_local and not remote:
        raise UsageError("--no-local needs --remote URL")
    urls: list[str] = []
    if remote:
        from ..dashboard.remote import parse_remote_url

        urls = [parse_remote_url(u) for u in remote]
    interval = checked_interval(interval)
    from ..app import run_dashboard
    from ..core.host.lifecycle import default_termination

    default_termination()  # the start-up guard's part is done: the dashboard keeps Python's own

    code = run_dashboard(
        gpu_key=key, interval_s=interval, readonly=readonly, remotes=urls, local=not no_local, all_owners=all_owners
    )
    if code:
        raise typer.Exit(code)  # a crashed dashboard: the shell must not see 0
