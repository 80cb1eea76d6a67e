"""The peers table's columns, UI-free: what the dashboard's table (which adds styles) and the `--once`
table (plain text) both show, in the same order, under the same headers, with the same cell text.

Widths are for the dashboard: at 80 terminal columns every column that matters fits; the optional
ones are dropped, least useful first (`drop`: highest first), when they do not (`fit_columns`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.accounting import SOURCE_BUSY_PPM
from ..core.pacer import BUSY_WINDOW_US
from ..core.rate import RATE_WINDOW_S
from .model import PeerRow

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison


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
    help: str = ""  # what it shows (the --once legend)


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
    if e.owner_config is not None:
        return "up ≠file" if r.differs_from_config else "up " + UP_STATE.get(state, state)
    return state


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


def _state_order(r: PeerRow) -> int:
    p = r.peer
    return 0 if p.alive and p.active else 1 if p.alive else 2


COLUMNS: tuple[Column, ...] = (
    Column("slot", "SLOT", 4, lambda r: str(r.peer.slot), lambda r: (r.gpu_key, r.peer.slot)),
    Column("pid", "PID", 7, lambda r: str(r.peer.pid), lambda r: r.peer.pid, right=True),
    Column("name", "NAME", 8, lambda r: r.peer.name or "", lambda r: (r.peer.name.lower(), r.peer.slot)),
    Column(
        "weight",
        "WGT",
        5,
        lambda r: fmt_weight(r.peer.weight),
        lambda r: _num_or(r.peer.weight),
        True,
        True,
    ),
    Column(
        "share",
        "SHR%",
        5,
        lambda r: f"{r.peer.share_pct:.1f}",
        lambda r: r.peer.share_pct,
        True,
        True,
        help="configured share (weight ÷ Σ weights, active peers)",
    ),
    Column(
        "busy",
        "BSY%",
        4,
        lambda r: f"{r.peer.busy_pct:.0f}",
        lambda r: r.peer.busy_pct,
        True,
        True,
        help=f"measured busy time, averaged over the last {BUSY_WINDOW_US / 1e6:g} s",
    ),
    Column(
        "ach",
        "ACH%",
        4,
        lambda r: fmt_pct(r.peer.achieved_pct),
        lambda r: _num_or(r.peer.achieved_pct),
        True,
        True,
        help="achieved share (busy ÷ Σ busy, active peers)",
    ),
    Column("status", "STATUS", 6, status_text, _state_order),
    Column(
        "toks",
        "TOK/S",
        5,
        lambda r: fmt_tok_s(r.tok_s),
        lambda r: _num_or(r.tok_s),
        True,
        True,
        help=f"tokens/s over the last {RATE_WINDOW_S:g} s of work (- until measured)",
    ),
    Column(
        "speed",
        "SPD%",
        4,
        lambda r: fmt_pct(r.speed_pct),
        lambda r: _num_or(r.speed_pct),
        True,
        True,
        help="speed vs solo (tok/s ÷ best tok/s alone)",
    ),
    Column("engine", "ENGINE", 9, engine_text, lambda r: (not r.managed, engine_text(r))),
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
    ),
    Column("vram", "VRAM", 5, lambda r: fmt_mib(r.vram_mib), lambda r: _num_or(r.vram_mib), True, True, drop=2),
    Column("gpu", "GPU", 12, lambda r: r.gpu_key, lambda r: (r.gpu_key, r.peer.slot), drop=3),
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


def legend() -> str:
    """One line saying what the less obvious columns mean (under the `--once` table)."""
    return "; ".join(f"{c.label} {c.help}" for c in COLUMNS if c.help)
