"""`gpushare-tui --once [--json]`: one snapshot of every segment, as a table or one JSON object.

Also the fast path: `headless_args` recognises a command line that asks for nothing else, so
the entry point can serve it without importing typer (or Textual) at all.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from ..core.host.errors import GpushareError, UsageError
from .common import ExitCode, checked_key

TYPE_CHECKING = False  # typing's, without importing typing: --once starts without it (issue 28)
if TYPE_CHECKING:
    from ..dashboard.columns import Column
    from ..dashboard.model import PeerRow
    from ..dashboard.remote import RemoteReport
    from ..dashboard.report import ReportData

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


ONCE_STATUS_TIMEOUT_S = 0.3  # each managed engine's `status`, asked once
ONCE_EXIT_RULE = (
    "Exit 0 when at least one segment was read (error rows beside it are shown), 1 when nothing asked for"
    " could be read (only error rows: an unreachable --remote, a corrupt segment; or no segment for"
    " --gpu-key), 2 for a usage error."
)


def collect(gpu_key: str | None, urls: Sequence[str] = (), local: bool = True, all_owners: bool = False) -> ReportData:
    """One snapshot of this host (unless not `local`: LiveSource, segments, NVML, managed engines'
    status) and of the `serve` endpoints `urls`: with any, every gpu and error is named by host (this
    host's name, or the endpoint's URL); a host that cannot be read is one error (`segment` ""), not a
    failure. Segments of other users beyond a cap are counted, not read, unless `all_owners`. What both
    the `--once` table and its JSON are made of; text as read (untrusted)."""
    from ..core.host.clock import wall_us
    from ..core.observe.snapshot import SegmentProblem
    from ..dashboard.model import unmanaged_view
    from ..dashboard.report import ReportData

    hostname = os.uname().nodename  # what socket.gethostname() returns, without importing socket
    remote = _RemoteFetch(urls) if urls else None  # asked at once, while this host is read
    data = ReportData(hostname, wall_us())
    if local:
        from ..dashboard.source import LiveSource

        source = LiveSource(gpu_key, status_timeout_s=ONCE_STATUS_TIMEOUT_S, sanitize=False, all_owners=all_owners)
        try:
            data = ReportData.of_model(source.collect(), hostname, hostname if urls else None)
        finally:
            source.close()
    if remote is None:
        return data
    views, errors = list(data.views), list(data.errors)
    for r in remote.reports():
        accounts = r.accounts or (None,) * len(r.gpus)
        views += [(r.host, unmanaged_view(g, a)) for g, a in zip(r.gpus, accounts) if gpu_key in (None, g.gpu_key)]
        errors += [(r.host, e) for e in r.errors]
        if r.error is not None:
            errors.append((r.host, SegmentProblem("", r.error)))
    return ReportData(hostname, data.now_us, views, errors, data.foreign_not_shown, data.foreign_shown_max)


class _RemoteFetch:
    """The `serve` endpoints' reports, fetched on a thread of their own (each host within its deadline)."""

    def __init__(self, urls: Sequence[str]) -> None:
        import threading

        from ..dashboard.remote import fetch_all

        self._reports: list[RemoteReport] = []
        self._thread = threading.Thread(target=lambda: self._reports.extend(fetch_all(urls)), daemon=True)
        self._thread.start()

    def reports(self) -> list[RemoteReport]:
        self._thread.join()
        return self._reports


def once_report(gpu_key: str | None) -> dict:
    """The JSON document of one snapshot of this host (all segments, or only `gpu_key`'s)."""
    from ..dashboard.report import report_json

    return report_json(collect(gpu_key))


def prometheus_text(gpu_key: str | None, all_owners: bool = False) -> str:
    """What `GET /metrics` of `gpushare-tui serve` returns for this host now (the same renderer)."""
    from ..dashboard.source import LiveSource
    from ..serve.exposition import render_metrics

    source = LiveSource(gpu_key, all_owners=all_owners)
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


def _cell(column: Column, row: PeerRow) -> str:
    from ..core.host.text import printable

    return printable(column.text(row))


def _cells(text: str) -> int:
    """Terminal cells `text` takes (wide East Asian characters take two)."""
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _line(columns: Sequence[Column], texts: list[str], widths: list[int]) -> str:
    out = []
    for c, t, w in zip(columns, texts, widths):
        fill = " " * (w - _cells(t))
        out.append(fill + t if c.right else t + fill)
    return (" " + " ".join(out)).rstrip()


def render_table(data: ReportData, show_idle: bool = True) -> str:
    """The human-readable `--once` table: per segment a line, then the dashboard's peers-table columns
    (every one, the table is not width-limited, but the latency columns only where an engine of the segment
    reports latency, as the dashboard) with the same headers and cell text; then the legend of the less obvious
    columns shown, one line each. Unless `show_idle`, segments with no live peer are left out (counted in a
    last line). Names, keys and errors are untrusted: every cell goes through `printable` (the JSON form keeps
    them, escaped)."""
    from ..core.host.text import printable
    from ..dashboard.columns import COLUMNS, LATENCY_KEYS, latency_reported, legend, schedule_note, users_note

    lines = []
    shown_keys: set[str] = set()
    views = [(h, v) for h, v in data.views if show_idle or any(r.peer.alive for r in v.rows)]
    hidden = len(data.views) - len(views)
    for host, v in views:
        g = v.snapshot
        period = f"{g.period_ms} ms" if g.period_ms is not None else "none (unthrottled)"
        warn = "  WARNING: group/world-writable" if g.writable_by_others else ""
        warn += f"  schedule {note}" if (note := schedule_note(g)) else ""  # Extension 1 (issue 20)
        where = f"{printable(host)}  " if host is not None else ""
        lines.append(
            f"{where}{printable(g.segment)}  owner {printable(g.owner)}  mode {g.mode:04o}  "
            f"period {period}  peers {len(g.peers)}{warn}"
        )
        if note := users_note(g):  # Extension 2: a line per GPU with two users or more
            lines.append(printable(note))
        columns = [c for c in COLUMNS if latency_reported(v.rows) or c.key not in LATENCY_KEYS]
        shown_keys.update(c.key for c in columns)
        cells = [[_cell(c, r) for c in columns] for r in v.rows]
        widths = [max([len(c.label)] + [_cells(row[i]) for row in cells]) for i, c in enumerate(columns)]
        lines.append(_line(columns, [c.label for c in columns], widths))
        lines += [_line(columns, row, widths) for row in cells]
    if views:
        lines.append(legend(shown_keys))
    for host, e in data.errors:
        where = ": ".join(printable(x) for x in (host or "", e.segment) if x)
        lines.append(f"error: {where}: {printable(e.error)}")
    if hidden:
        lines.append(f"{hidden} segment(s) with no live peers hidden (--all shows them)")
    if data.foreign_not_shown:
        from ..core.observe.snapshot import foreign_not_shown_text

        lines.append(foreign_not_shown_text(data.foreign_not_shown))
    elif not hidden and not data.views and not data.errors:
        lines.append("no /opencoti-gpu-* segments on this host")
    return "\n".join(lines)


def print_once(
    gpu_key: str | None,
    as_json: bool,
    remotes: Sequence[str] = (),
    local: bool = True,
    fmt: str | None = None,
    show_idle: bool = False,
    all_owners: bool = False,
) -> ExitCode:
    """Print one snapshot (`fmt`: table, json or prometheus; `as_json` is json) of this host and the
    `remotes` (`serve` URLs; their unreachable hosts are error rows). Exit code (ONCE_EXIT_RULE): 0 when
    at least one segment was read, or there is none to read and nothing failed; 1 when nothing asked for
    could be read (only error rows: unreachable hosts, corrupt segments; or no segment for the key);
    the document is printed either way (not for a key with no segment). The table leaves out
    segments with no live peer unless `show_idle` or the key names one; the JSON lists every one. Both
    leave out segments of other users beyond a cap (counted) unless `all_owners`.
    UsageError for an invalid key, URL or combination. Exit 1 if stdout is closed early."""
    key = checked_key(gpu_key)
    fmt = _checked_format(fmt, as_json, remotes, local)
    urls: list[str] = []
    if remotes:
        from ..dashboard.remote import parse_remote_url

        urls = [parse_remote_url(u) for u in remotes]
    if fmt == "prometheus":
        text = prometheus_text(key, all_owners)
    else:
        data = collect(key, urls, local, all_owners)
        if key is not None and not data.views and not data.errors:
            from ..core.registry.abi import segment_name

            raise GpushareError(f"no segment {segment_name(key)} on this host")  # a typo must not look like success
        show_idle = show_idle or key is not None
        if fmt == "json":
            from ..dashboard.report import report_json

            text = json.dumps(report_json(data), allow_nan=False)
        else:
            text = render_table(data, show_idle)
    try:
        print(text, end="" if fmt == "prometheus" else "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`| head`): exit 1 quietly, and don't fail again flushing at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.ERROR
    if fmt != "prometheus" and not data.views and data.errors:
        return ExitCode.ERROR  # only error rows: nothing asked for could be read
    return ExitCode.OK
