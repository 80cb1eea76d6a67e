"""`gpushare-tui --once [--json]`: one snapshot of every segment, as a table or one JSON object.

Also the fast path: `headless_args` recognises a command line that asks for nothing else, so
the entry point can serve it without importing typer (or Textual) at all.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence

from ..core.errors import GpushareError, UsageError
from .common import ExitCode, checked_key

_KEY_EQ = "--gpu-key="


def headless_args(argv: Sequence[str]) -> tuple[str | None, bool] | None:
    """(--gpu-key value or None, --json given) when `argv` holds `--once` and otherwise only
    `--json`, `--gpu-key KEY` or `--gpu-key=KEY` (the last key wins, as in the full parser);
    else None: anything more (help, other options, a command) is the full parser's."""
    once = as_json = False
    key: str | None = None
    args = iter(argv)
    for a in args:
        if a == "--once":
            once = True
        elif a == "--json":
            as_json = True
        elif a == "--gpu-key":
            key = next(args, None)  # the next word, whatever it is, like click
            if key is None:
                return None  # a missing value: the full parser's error
        elif a.startswith(_KEY_EQ):
            key = a[len(_KEY_EQ) :]
        else:
            return None
    return (key, as_json) if once else None


def once_report(gpu_key: str | None) -> dict:
    """The JSON document of one snapshot (all segments, or only `gpu_key`'s)."""
    from ..core.clock import wall_us
    from ..core.control import is_managed
    from ..core.snapshot import SegmentReader, report_to_json

    reader = SegmentReader(gpu_key)
    try:
        now = wall_us()
        gpus, errors = reader.read(now)
        report = report_to_json(gpus, errors, now)
    finally:
        reader.close()
    for g in report["gpus"]:
        for p in g["peers"]:
            p["managed"] = is_managed(p["pid"])  # has our control socket (this user's engines only)
    return report


def remote_report(gpu_key: str | None, urls: Sequence[str], local: bool) -> dict:
    """The `--once --json` document over this host (unless not `local`) and the `serve` endpoints `urls`:
    every gpu and error carries `host` (this host's name, or the endpoint's URL); a host that cannot be
    read is one error (`segment` ""), not a failure."""
    from ..core.clock import wall_us
    from ..core.snapshot import gpu_to_json, report_to_json
    from ..dashboard.remote import fetch_all

    report = once_report(gpu_key) if local else report_to_json([], [], wall_us())
    here = report["hostname"]
    for g in report["gpus"]:
        g["host"] = here
    for e in report["errors"]:
        e["host"] = here
    for r in fetch_all(urls):
        report["gpus"] += [{**gpu_to_json(g), "host": r.host} for g in r.gpus if gpu_key in (None, g.gpu_key)]
        report["errors"] += [{"segment": e.segment, "error": e.error, "host": r.host} for e in r.errors]
        if r.error is not None:
            report["errors"].append({"segment": "", "error": r.error, "host": r.host})
    return report


def prometheus_text(gpu_key: str | None) -> str:
    """What `GET /metrics` of `gpushare-tui serve` returns for this host now (the same renderer)."""
    from ..dashboard.source import LiveSource
    from ..serve.exposition import render_metrics

    source = LiveSource(gpu_key)
    try:
        return render_metrics(source.collect).decode()
    finally:
        source.close()


FORMATS = ("table", "json", "prometheus")


def _checked_format(fmt: str | None, as_json: bool, remotes: Sequence[str], local: bool) -> str:
    if fmt is not None and fmt not in FORMATS:
        raise UsageError(f"invalid --format {fmt!r}: one of {', '.join(FORMATS)}")
    if as_json and fmt not in (None, "json"):
        raise UsageError(f"--json contradicts --format {fmt}")
    fmt = fmt or ("json" if as_json else "table")
    if fmt == "prometheus" and remotes:
        raise UsageError("--format prometheus shows this host only (scrape each host's serve instead of --remote)")
    if not local and not remotes:
        raise UsageError("--no-local needs --remote URL")
    return fmt


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _age(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.0f}"


def render_table(report: dict, show_idle: bool = True) -> str:
    """The human-readable `--once` table; unless `show_idle`, segments with no live peer are left out
    (counted in a last line). Names, keys and errors are untrusted: control characters never reach the
    terminal (the JSON form keeps them, escaped)."""
    from ..core.text import printable

    lines = []
    gpus = report["gpus"] if show_idle else [g for g in report["gpus"] if any(p["alive"] for p in g["peers"])]
    hidden = len(report["gpus"]) - len(gpus)
    for g in gpus:
        period = f"{g['period_ms']} ms" if g["period_ms"] is not None else "none (unthrottled)"
        warn = "  WARNING: group/world-writable" if g["writable_by_others"] else ""
        host = f"{printable(g['host'])}  " if "host" in g else ""
        lines.append(
            f"{host}{printable(g['segment'])}  owner {printable(g['owner'])}  mode {g['mode']}  "
            f"period {period}  peers {len(g['peers'])}{warn}"
        )
        lines.append(
            f"  {'SLOT':>4} {'PID':>8} {'NAME':<20} {'WEIGHT':>7} {'SHARE%':>7} {'BUSY%':>6} {'ACH%':>5} "
            f"{'ACTIVE':<6} {'ALIVE':<5} {'HB_MS':>7}  WINDOW_US"
        )
        for p in g["peers"]:
            win = f"[{p['window_us'][0]}, {p['window_us'][1]})" if p["window_us"] else "-"
            lines.append(
                f"  {p['slot']:>4} {p['pid']:>8} {printable(p['name'])[:20]:<20} {_fmt(p['weight'], '.3g'):>7} "
                f"{p['share_pct']:>7.1f} {p['busy_pct']:>6.1f} {_fmt(p.get('achieved_pct'), '.1f'):>5} "
                f"{'yes' if p['active'] else 'no':<6} "
                f"{'yes' if p['alive'] else 'no':<5} {_age(p['heartbeat_age_ms']):>7}  {win}"
            )
    for e in report["errors"]:
        where = ": ".join(printable(x) for x in (e.get("host", ""), e["segment"]) if x)
        lines.append(f"error: {where}: {printable(e['error'])}")
    if hidden:
        lines.append(f"{hidden} segment(s) with no live peers hidden (--all shows them)")
    elif not report["gpus"] and not report["errors"]:
        lines.append("no /opencoti-gpu-* segments on this host")
    return "\n".join(lines)


def print_once(
    gpu_key: str | None,
    as_json: bool,
    remotes: Sequence[str] = (),
    local: bool = True,
    fmt: str | None = None,
    show_idle: bool = False,
) -> ExitCode:
    """Print one snapshot (`fmt`: table, json or prometheus; `as_json` is json) of this host and the
    `remotes` (`serve` URLs; their unreachable hosts are error rows, exit 0). The table leaves out
    segments with no live peer unless `show_idle` or the key names one; the JSON lists every one.
    UsageError for an invalid key, URL or combination. Exit 1 if stdout is closed early."""
    key = checked_key(gpu_key)
    fmt = _checked_format(fmt, as_json, remotes, local)
    urls: list[str] = []
    if remotes:
        from ..dashboard.remote import parse_remote_url

        urls = [parse_remote_url(u) for u in remotes]
    if fmt == "prometheus":
        text = prometheus_text(key)
    else:
        report = remote_report(key, urls, local) if remotes else once_report(key)
        if key is not None and not report["gpus"] and not report["errors"]:
            from ..core.abi import segment_name

            raise GpushareError(f"no segment {segment_name(key)} on this host")  # a typo must not look like success
        show_idle = show_idle or key is not None
        text = json.dumps(report, allow_nan=False) if fmt == "json" else render_table(report, show_idle)
    try:
        print(text, end="" if fmt == "prometheus" else "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`| head`): exit 1 quietly, and don't fail again flushing at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.ERROR
    return ExitCode.OK
