"""The peers table's columns, UI-free: what the dashboard's table (which adds styles) and the `--once`
table (plain text) both show, in the same order, under the same headers, with the same cell text.

Widths are for the dashboard: at 80 terminal columns every column that matters fits; the optional
ones are dropped, least useful first (`drop`: highest first), when they do not (`fit_columns`).
A column is defined once, here: its `help` is its definition on the dashboard's help screen, its
`legend` (if any) its short form under the `--once` table; a new column needs nothing elsewhere
but a sort-cycle entry (widgets.peers_table.SORT_CYCLE) if `o` should reach it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.engines.kinds import kind_named
from ..core.host.text import counted
from ..core.observe.accounting import SOURCE_BUSY_PPM
from ..core.observe.snapshot import GpuSnapshot
from ..core.pacing.pacer import BUSY_WINDOW_US
from ..core.pacing.rate import RATE_WINDOW_S
from ..core.registry.abi import ACTIVITY_WINDOW_US, ALIVE_US
from ..core.schedule.v1 import SHARE_FLOOR
from .model import EngineInfo, PeerRow

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison

    from ..core.observe.latency import LatencyReport
    from ..core.pacing.governor import SloReport


@dataclass(frozen=True)
class Column:
    key: str
    label: str  # header text
    width: int  # cells, in the dashboard (NAME's is its minimum)
    text: Callable[[PeerRow], str]  # the plain cell text (untrusted text as the row holds it)
    sort: Callable[[PeerRow], SupportsRichComparison]  # the sort key
    right: bool = False  # right-justified (numbers)
    descending: bool = False  # the first sort by it is high → low
    drop: int = 0  # 0: always shown; else dropped when the width is short, highest first
    help: str = ""  # what it shows: the help screen's definition (every column has one)
    legend: str = ""  # its short form in the `--once` legend line ("": not there; the obvious columns)


def _num_or(x: float | None, default: float = -1.0) -> float:
    return default if x is None else x


def fmt_weight(w: float | None) -> str:
    """At most 5 characters; "bad" for an invalid weight."""
    if w is None:
        return "bad"
    text = f"{w:.3g}"
    return text if len(text) <= 5 else f"{w:.0e}"


def fmt_age(ms: float | None) -> str:
    if ms is None:
        return "?"  # no heartbeat, or one far in the future: invalid
    if ms < 1000:
        return "<1s"  # heartbeats come every ~0.5 s: finer would only flicker
    if ms < 10_000:
        return f"{ms / 1000:.1f}s"
    if ms < 600_000:
        return f"{ms / 1000:.0f}s"
    return "old"


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def fmt_tok_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def fmt_mib(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}M" if x < 10_000 else f"{x / 1024:.1f}G"


def status_text(r: PeerRow) -> str:
    p = r.peer
    return ("active" if p.active else "idle") if p.alive else "dead"


UP_STATE = {"running": "run", "loading": "load", "stopped": "stop", "exiting": "exit"}


def engine_text(r: PeerRow) -> str:
    """What the engine's control socket said: its state, "read-only" (a foreign peer), "no reply", "…"
    (not asked yet), "up …" (owned by `gpushare-tui up`), "-" (dead)."""
    if not r.peer.alive:
        return "-"
    if not r.managed:
        return "read-only"
    e = r.engine
    if e is None:
        return "…"
    if e.error:
        return "no reply"
    state = e.state or "?"
    shown = (kind_text(e) if state == "running" else None) or state
    if e.owner_config is not None:
        return "up ≠file" if r.differs_from_config else "up " + UP_STATE.get(shown, shown)
    return shown


# -- issue 19: a running engine that names its activity source shows its kind (and the source, unless the kind's own)


def kind_text(e: EngineInfo) -> str | None:
    """The engine's kind ("llama", "vllm"), then ·its activity source unless that is the kind's own ("cmd·cpu",
    "llama·always"); None when its status gave no activity (an older reply, a GpuShare or synthetic engine)."""
    if e.activity is None:
        return None
    k = kind_named(e.kind)
    if k is None:
        return f"{e.kind or '?'}·{e.activity}"
    return k.short if k.activity == e.activity else f"{k.short}·{e.activity}"


# -- latency class (issue 20, spec §7 Extension 1) --------------------------------------------------------
CLASS_SHORT = {"interactive": "int", "batch": "bat"}
CLASS_LEGEND = "CLS: int interactive · bat batch · * has priority now · + has work in flight · v1 no classes"


def class_text(r: PeerRow) -> str:
    """The peer's latency class, `int`/`bat`, then `*` while it holds priority or `+` while it has work in
    flight (DEMAND); `v1` for a peer without Extension 1 (no class, no demand)."""
    p = r.peer
    if p.klass is None:
        return "v1"
    return CLASS_SHORT.get(p.klass, "?") + ("*" if p.priority else "+" if p.demand else "")


def _class_order(r: PeerRow) -> tuple[bool, bool, bool, bool]:
    p = r.peer
    return (p.klass != "interactive", p.klass is None, not p.priority, not p.demand)


def schedule_note(g: GpuSnapshot) -> str:
    """What a GPU line says of its schedule, in words: "interactive first" when the Extension-1 schedule applies
    ("interactive first: slot N has priority" while priority members run first; ", fair between users" when
    Extension 2 splits the GPU between two users or more), "classes off: slot N is an older (v1) peer" when a
    member without Extension 1 puts the others back on §5, "" for a v1-only segment."""
    users = ", fair between users" if g.users_applied and len(g.users) > 1 else ""  # one user: nothing to split
    if g.schedule_mode == "priority":
        slots = ", ".join(map(str, g.priority_slots))
        who = f"slot {slots} has" if len(g.priority_slots) == 1 else f"slots {slots} have"
        return f"interactive first: {who} priority{users}"
    if g.schedule_mode == "ext1":
        return f"interactive first{users}"
    if g.v1_peer is not None and any(p.alive and p.klass is not None for p in g.peers):
        return f"classes off: slot {g.v1_peer} is an older (v1) peer"
    return ""


def users_note(g: GpuSnapshot) -> str:
    """A GPU's per-user line (Extension 2, spec §8), "" unless its alive peers are of two users or more:
    whether the device is split between users ("fair between users") or per engine (and why), then per
    user its engines, share of the period, achieved share and busy."""
    rows = g.users
    if len(rows) < 2:
        return ""
    how = "fair between users" if g.users_applied else f"per engine ({g.users_fallback or 'no members'})"
    parts = [
        f"{u.user}: {counted(u.engines, 'engine')}, share {fmt_pct(u.share_pct)}%, "
        f"ach {fmt_pct(u.achieved_pct)}%, busy {fmt_pct(u.busy_pct)}%"
        for u in rows
    ]
    return f"users {how} · " + " · ".join(parts)


# -- accounting (issue 21): device time and energy per engine (core.accounting) ------------------------
def fmt_busy_time(s: float | None) -> str:
    """Busy seconds as h:mm:ss, hours alone from 1000 h ("-": unknown; "huge": beyond 8 characters,
    a counter no engine reaches)."""
    if s is None:
        return "-"
    whole = int(s)
    if whole >= 1000 * 3600:
        text = f"{whole // 3600}h"
        return text if len(text) <= 8 else "huge"
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def fmt_wh(j: float | None) -> str:
    """Joules as Wh, at most 6 characters ("-": unknown)."""
    if j is None:
        return "-"
    wh = j / 3600
    return f"{wh:.2f}" if wh < 100 else f"{wh:.0f}" if wh < 100_000 else f"{wh / 1000:.0f}k"


def busy_time_text(r: PeerRow) -> str:
    """TIME: busy since it joined ("~": a v1 peer's busy_ppm integrated since this view saw it)."""
    a = r.account
    if a is None:
        return "-"
    text = fmt_busy_time(a.busy_s)
    return "~" + text if a.source == SOURCE_BUSY_PPM and a.busy_s is not None else text


ACCOUNTING_COLUMNS: tuple[Column, ...] = (
    Column(
        "time",
        "TIME",
        8,
        busy_time_text,
        lambda r: _num_or(r.account.busy_s if r.account else None),
        True,
        True,
        drop=4,
        help="device time busy since it joined, h:mm:ss (~: estimated from BSY% since this view started)",
    ),
    Column(
        "energy",
        "ENERGY",
        6,
        lambda r: fmt_wh(r.account.energy_j if r.account else None),
        lambda r: _num_or(r.account.energy_j if r.account else None),
        True,
        True,
        drop=5,
        help="device energy by its busy time, Wh, since this view started (NVML or RAPL; - without)",
    ),
)
# -- end accounting ----------------------------------------------------------------------------------


# -- latency as clients see it (core.observe.latency): an engine behind a front proxy, over the last minute ------
MISSED_MARK = "!"  # after a p99 above the engine's target (its `slo`)
SLO_REASON_SHOWN_CHARS = 300  # of a governor's reason (the engine's own text): a line, not a page


def fmt_ms(ms: float | None) -> str:
    """A duration in ms, at most 4 characters: "0.4", "85", "850", "1.2s", "12s", "99m" ("-": unknown; "?": below
    0, what no clock measures: an engine's reply that says so is wrong)."""
    if ms is None:
        return "-"
    if ms < 0:
        return "?"
    if ms < 10:
        return f"{ms:.1f}"
    if ms < 999.5:
        return f"{ms:.0f}"
    s = ms / 1000
    if s < 9.95:
        return f"{s:.1f}s"
    if s < 999.5:
        return f"{s:.0f}s"
    return f"{s / 60:.0f}m" if s < 99.5 * 60 else "long"


def fmt_rate(x: float | None) -> str:
    """Requests per second, at most 5 characters ("-": unknown; "?": below 0)."""
    if x is None:
        return "-"
    if x < 0:
        return "?"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}" if x < 99_999.5 else "many"


def _p99_text(r: PeerRow, figure: str) -> str:
    """TTFT99 / ITL99: the last minute's p99, MISSED_MARK when above the engine's target."""
    lat = r.latency
    ms = None if lat is None else getattr(lat, f"{figure}_p99_ms")
    slo = r.engine.slo if r.engine is not None else None
    target = None if slo is None else getattr(slo, f"{figure}_p99_ms")
    return fmt_ms(ms) + (MISSED_MARK if ms is not None and target is not None and ms > target else "")


def _p99_of(r: PeerRow, figure: str) -> float:
    lat = r.latency
    return _num_or(None if lat is None else getattr(lat, f"{figure}_p99_ms"))


_WINDOW = "over the last minute, as its clients see it (measured at its front proxy; - without one)"
LATENCY_COLUMNS: tuple[Column, ...] = (
    Column(
        "ttft",
        "TTFT99",
        6,
        lambda r: _p99_text(r, "ttft"),
        lambda r: _p99_of(r, "ttft"),
        True,
        True,
        drop=2,
        help=f"time to first token, p99, {_WINDOW}: request body received → first token chunk relayed; "
        f"{MISSED_MARK}: above its target",
        legend=f"time to first token p99, last minute ({MISSED_MARK}: above its target)",
    ),
    Column(
        "itl",
        "ITL99",
        5,
        lambda r: _p99_text(r, "itl"),
        lambda r: _p99_of(r, "itl"),
        True,
        True,
        drop=4,
        help=f"inter-token latency, p99, {_WINDOW}: the gap between streamed chunks; {MISSED_MARK}: above its target",
        legend="inter-token gap p99, last minute",
    ),
    Column(
        "reqs",
        "REQ/S",
        5,
        lambda r: fmt_rate(r.latency.req_s if r.latency is not None else None),
        lambda r: _num_or(r.latency.req_s if r.latency is not None else None),
        True,
        True,
        drop=5,
        help=f"requests answered (2xx) per second {_WINDOW}",
    ),
)
LATENCY_KEYS = frozenset(c.key for c in LATENCY_COLUMNS)


def latency_reported(rows: Iterable[PeerRow]) -> bool:
    """Whether some engine of `rows` reports its clients' latency (a front proxy's figures): the latency columns
    are shown only then (the dashboard's table and the `--once` table)."""
    return any(r.latency is not None for r in rows)


def latency_text(lat: LatencyReport) -> str:
    """An engine's latency in one line (`status NAME`, the detail view)."""
    parts = []
    for figure in ("ttft", "itl", "e2e"):
        p50, p99 = getattr(lat, f"{figure}_p50_ms"), getattr(lat, f"{figure}_p99_ms")
        if p50 is not None or p99 is not None:
            parts.append(f"{figure} p50 {fmt_ms(p50)} p99 {fmt_ms(p99)} ms".replace("s ms", "s"))
    window = f" over {lat.window_s:.0f} s" if lat.window_s is not None else ""
    rate = f"{fmt_rate(lat.req_s)} req/s{window}" if lat.req_s is not None else "no rate"
    now = f"{lat.in_flight if lat.in_flight is not None else '?'} in flight ({lat.waiting or 0} waiting)"
    totals = ", ".join(f"{c} {n}" for c, n in lat.status_totals() if n)
    return "; ".join(filter(None, [", ".join(parts) or "no request yet", rate, now, totals]))


def slo_text(slo: SloReport) -> str:
    """An engine's target and how it fares, in one line (`status NAME`, the detail view)."""
    targets = []
    for figure in ("ttft", "itl"):
        target, pct = getattr(slo, f"{figure}_p99_ms"), getattr(slo, f"{figure}_attained_pct")
        if target is not None:
            within = f" ({pct:.1f}% within, last minute)" if pct is not None else ""
            targets.append(f"{figure} p99 ≤ {target:g} ms{within}")
    state = slo.state or "?"
    if state == "paused" and slo.paused_s:
        state += f" {slo.paused_s:.0f} s more (set by hand)"
    bounds = ""
    if slo.weight_min is not None and slo.weight_max is not None:
        bounds = f"; weight {slo.weight_min:g}-{slo.weight_max:g}" + (f", {slo.classes}" if slo.classes else "")
    why = slo.reason or ""
    reason = f"; {why[:SLO_REASON_SHOWN_CHARS]}{'…' if len(why) > SLO_REASON_SHOWN_CHARS else ''}" if why else ""
    return f"{', '.join(targets) or 'no target'}: {state}{bounds}{reason}"


# -- end latency --------------------------------------------------------------------------------------------------


def _state_order(r: PeerRow) -> int:
    p = r.peer
    return 0 if p.alive and p.active else 1 if p.alive else 2


FLOOR_MARK = "*"  # after SHR% when the floor lifted the window above w ÷ Σw
_ALIVE_S = f"{ALIVE_US / 1e6:g}"
_ACTIVITY_S = f"{ACTIVITY_WINDOW_US / 1e6:g}"


def share_text(r: PeerRow) -> str:
    """SHR%: the window share the engine gets (FLOOR_MARK when the floor lifted it); "-" when not a member."""
    p = r.peer
    if p.window_pct is None:
        return "-"
    return f"{p.window_pct:.1f}{FLOOR_MARK if p.floor_lifted else ''}"


def busy_text(r: PeerRow) -> str:
    """BSY%: "-" for a dead peer (its last busy fraction is history, not a reading)."""
    return f"{r.peer.busy_pct:.0f}" if r.peer.alive else "-"


def _alive_or(r: PeerRow, x: float | None) -> float | None:
    """`x` for a live peer; None (shown "-") for a dead one: what it last said is not a reading now."""
    return x if r.peer.alive else None


COLUMNS: tuple[Column, ...] = (
    Column(
        "slot",
        "SLOT",
        4,
        lambda r: str(r.peer.slot),
        lambda r: (r.gpu_key, r.peer.slot),
        help="its slot in the segment (0-15); the swatch is its colour in the timeline and the plots",
    ),
    Column("pid", "PID", 7, lambda r: str(r.peer.pid), lambda r: r.peer.pid, right=True, help="its process id"),
    Column(
        "name",
        "NAME",
        8,
        lambda r: r.peer.name or "",
        lambda r: (r.peer.name.lower(), r.peer.slot),
        help="the name it registered",
    ),
    Column(
        "user",
        "USER",
        7,
        lambda r: r.peer.user if r.peer.user is not None else "-",
        lambda r: (r.peer.user or "~", r.peer.slot),
        drop=4,
        help=(
            "whose engine it is: the user of its process as the kernel says (/proc: its real uid, never what "
            "it writes); - when this reader cannot verify it. With Extension 2 the users share the GPU "
            "equally and each user's engines share the user's part by weight"
        ),
    ),
    Column(
        "weight",
        "WGT",
        5,
        lambda r: fmt_weight(r.peer.weight),
        lambda r: _num_or(r.peer.weight),
        True,
        True,
        help="its weight (bad: not a finite number > 0)",
    ),
    Column(
        "share",
        "SHR%",
        5,
        share_text,
        lambda r: _num_or(r.peer.window_pct),
        True,
        True,
        help=(
            f"the share of the GPU it gets while busy: its window, weight ÷ Σ weights of the active peers "
            f"with a floor of {SHARE_FLOOR:.0%} ({FLOOR_MARK}: the floor lifted it above weight ÷ Σ weights, "
            "and the others' windows shrink to pay for it); - when idle (no window)"
        ),
        legend=f"share it gets while busy: its window, weight ÷ Σ weights with a {SHARE_FLOOR:.0%} floor "
        f"({FLOOR_MARK}: lifted by the floor; - idle)",
    ),
    Column(
        "busy",
        "BSY%",
        4,
        busy_text,
        lambda r: r.peer.busy_pct if r.peer.alive else -1.0,
        True,
        True,
        help=(
            f"the busy fraction the peer itself reports for its last {BUSY_WINDOW_US / 1e6:g} s. gpushare-tui's "
            "own engines (GpuShare, synth, the demo's): the wall-clock time in their steps, time runnable but "
            "waiting for a CPU included, so not bounded by their windows (on a loaded host the peers' BSY% can "
            "sum past 100); a supervised llama-server: its GPU time (NVML), else its CPU time; - when dead"
        ),
        legend=f"busy fraction it reports for its last {BUSY_WINDOW_US / 1e6:g} s (waiting for a CPU included: "
        "can sum past 100 on a loaded host)",
    ),
    Column(
        "ach",
        "ACH%",
        4,
        lambda r: fmt_pct(_alive_or(r, r.peer.achieved_pct)),
        lambda r: _num_or(_alive_or(r, r.peer.achieved_pct)),
        True,
        True,
        help=(
            "achieved share: its BSY% ÷ Σ BSY% of the active peers (time on the device, whatever the model). "
            f"An engine keeps its window for {_ACTIVITY_S} s after its last request (the activity window): "
            "meanwhile the others still get only their own windows, so right after a request ends ACH% can "
            "differ from SHR%"
        ),
        legend="achieved share (busy ÷ Σ busy, active peers)",
    ),
    Column(
        "status",
        "STATUS",
        6,
        status_text,
        _state_order,
        help=(
            f"active (worked in the last {_ACTIVITY_S} s: it has a window), idle (registered, no window), "
            f"dead (no heartbeat for {_ALIVE_S} s: a joining peer may take its slot)"
        ),
    ),
    Column(
        "toks",
        "TOK/S",
        5,
        lambda r: fmt_tok_s(_alive_or(r, r.tok_s)),
        lambda r: _num_or(_alive_or(r, r.tok_s)),
        True,
        True,
        help=f"tokens/s over the last {RATE_WINDOW_S:g} s of work (- until measured)",
        legend=f"tokens/s over the last {RATE_WINDOW_S:g} s of work (- until measured)",
    ),
    Column(
        "speed",
        "SPD%",
        4,
        lambda r: fmt_pct(r.speed_pct),
        lambda r: _num_or(r.speed_pct),
        True,
        True,
        help=(
            "speed vs solo: TOK/S ÷ the best tok/s it reached running alone (the only active peer, no other "
            "peer busy); - while idle and until it has run alone"
        ),
        legend="speed vs solo (tok/s ÷ best tok/s alone; - while idle)",
    ),
    *LATENCY_COLUMNS,
    Column(
        "engine",
        "ENGINE",
        9,
        engine_text,
        lambda r: (not r.managed, engine_text(r)),
        help=(
            'what the engine\'s control socket says: running, loading, exiting; "up …" under gpushare-tui up '
            '("up ≠file": its weight differs from the file), "read-only" (a foreign peer: no gpushare-tui '
            'control socket), "no reply"; pacing pauses are not a state (the timeline shows who runs)'
        ),
    ),
    *ACCOUNTING_COLUMNS,
    Column(
        "hb",
        "HB",
        4,
        lambda r: fmt_age(r.peer.heartbeat_age_ms),
        lambda r: _num_or(r.peer.heartbeat_age_ms),
        True,
        True,
        drop=1,
        help=f"age of its last heartbeat (every 0.5 s; dead after {_ALIVE_S} s; ?: none, or in the future)",
    ),
    Column(
        "vram",
        "VRAM",
        5,
        lambda r: fmt_mib(r.vram_mib),
        lambda r: _num_or(r.vram_mib),
        True,
        True,
        drop=2,
        help="GPU memory its process uses (NVML; - without it)",
    ),
    Column(
        "gpu",
        "GPU",
        12,
        lambda r: r.gpu_key,
        lambda r: (r.gpu_key, r.peer.slot),
        drop=3,
        help="the gpu key of its segment (HOST:PORT/KEY for a --remote host's)",
    ),
    Column(
        "class",
        "CLS",
        4,
        class_text,
        _class_order,
        drop=5,
        help="latency class (int/bat; * holds priority, + work in flight; v1: no Extension 1)",
    ),
)
COLUMN_BY_KEY = {c.key: c for c in COLUMNS}
NAME_WIDTH = (8, 28)  # NAME takes what the width leaves, within these
NAME_KEEP = 12  # an optional column is shown only if NAME still gets this much: names identify peers
GAP = 1  # blank cells before each column


def fit_columns(available: int, empty: frozenset[str] = frozenset()) -> tuple[tuple[Column, ...], int]:
    """The columns shown in `available` cells, and NAME's width. Optional columns are dropped, highest
    `drop` first (GPU, VRAM, HB), until the rest fit with NAME at NAME_KEEP (the ones in `empty`, with
    nothing to show, e.g. VRAM without NVML, go first); NAME gets what is left (within NAME_WIDTH).
    The columns with drop 0 always fit at 80 terminal columns."""
    lo, hi = NAME_WIDTH
    shown = [c for c in COLUMNS if c.key not in empty or not c.drop]

    def others() -> int:
        return sum(c.width + GAP for c in shown if c.key != "name") + GAP

    for c in sorted((c for c in shown if c.drop), key=lambda c: -c.drop):
        if others() + NAME_KEEP <= available:
            break
        shown.remove(c)
    return tuple(shown), max(lo, min(hi, available - others()))


LEGEND_WIDTH = 100  # the `--once` legend's lines wrap here (a reader's terminal, not one 600-character line)


def legend(shown: Collection[str] | None = None) -> str:
    """What the less obvious columns mean (under the `--once` table): a line each (LABEL, then its meaning, wrapped
    at LEGEND_WIDTH with the meaning's indent), for the columns whose keys are in `shown` (None: every one)."""
    cols = [c for c in COLUMNS if c.legend and (shown is None or c.key in shown)]
    indent = max(len(c.label) for c in COLUMNS if c.legend) + 2  # the same whichever are shown
    return "\n".join(
        textwrap.fill(c.legend, LEGEND_WIDTH, initial_indent=c.label.ljust(indent), subsequent_indent=" " * indent)
        for c in cols
    )
