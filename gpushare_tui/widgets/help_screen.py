"""`?`: an overlay listing every key, made from the App's bindings."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..core.pacer import BUSY_WINDOW_US
from ..core.rate import RATE_WINDOW_S
from .dialog import Dialog

NAVIGATION = (
    ("↑ ↓ / mouse", "select a peer (the plots follow its GPU)"),
    ("PgUp PgDn Home End", "move in the peers table"),
    ("click a header", "sort by that column (again: reverse)"),
)


@dataclass(frozen=True)
class HelpRow:
    keys: str  # "+ / -": every key with this text
    what: str
    admin: bool  # disabled with --readonly


def help_rows(
    bindings: Iterable[BindingType], key_display: Callable[[Binding], str], is_admin: Callable[[str], bool]
) -> list[HelpRow]:
    """One row per distinct `tooltip` (the help text), in binding order; the keys that share
    it are joined ("q / Ctrl+C"). Bindings without a tooltip are not listed. `is_admin` gets
    the action's name without its parameters."""
    keys: dict[str, list[str]] = {}
    admin: dict[str, bool] = {}
    for b in Binding.make_bindings(bindings):
        if not b.tooltip:
            continue
        shown = keys.setdefault(b.tooltip, [])
        display = key_display(b)
        if display not in shown:
            shown.append(display)
        admin[b.tooltip] = admin.get(b.tooltip, False) or is_admin(b.action.partition("(")[0])
    return [HelpRow(" / ".join(k), what, admin[what]) for what, k in keys.items()]


def help_table(rows: list[HelpRow], readonly: bool) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    for key, what in NAVIGATION:
        t.add_row(key, what)
    t.add_row("", "")
    for r in rows:
        if r.admin and readonly:
            t.add_row(Text(r.keys, style="dim strike"), Text(f"{r.what} (disabled: --readonly)", style="dim"))
        else:
            t.add_row(r.keys, r.what)
    return t


class HelpScreen(Dialog[None]):
    DEFAULT_CSS = """
    HelpScreen > VerticalScroll { width: 76; max-height: 90%; }
    HelpScreen .foot { color: $text-muted; margin-top: 1; }
    """

    BINDINGS = [Binding("escape,q,question_mark,enter", "close", "Close")]

    def __init__(self, rows: list[HelpRow], readonly: bool) -> None:
        super().__init__()
        self.rows = rows
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("gpushare-tui — keys", classes="title")
            yield Static(help_table(self.rows, self.readonly), id="help-keys")
            yield Static(
                "Timeline: each active peer's window in one TDM period, in its colour; ▼ marks now "
                "(who may run this instant). SHR% = weight ÷ Σ weights of active peers; BSY% = the "
                f"peer's measured busy time, averaged over its last {BUSY_WINDOW_US / 1e6:g} s. ACH% (achieved "
                "share) = busy ÷ Σ busy of the active peers: time on the device, whatever the model "
                "(plotted as a 5 s average against the configured share, dashed). TOK/S: over the "
                f"engine's last {RATE_WINDOW_S:g} s of work (- until measured); SPD% = TOK/S ÷ its best tok/s "
                "alone (its solo speed; - until it has run alone). ENGINE: the engine's state (running, loading, "
                'exiting; "up …" under gpushare-tui up, "up ≠file" when its weight differs from the file); pacing '
                "pauses are not a state: the timeline shows who runs. "
                "TIME: the peer's device time, busy h:mm:ss since it joined (its slot's busy counter; ~ for an "
                "engine without one: estimated from BSY% since this view started). ENERGY: Wh of the device's "
                "energy (NVML, or RAPL on a CPU host) split by busy time since this view started, the rest idle. "
                "Foreign peers (no gpushare-tui control "
                "socket) are read-only. On a "
                "narrow terminal ENERGY, TIME, GPU, VRAM and HB are left out. Esc / ? closes.",
                classes="foot",
            )

    def action_close(self) -> None:
        self.dismiss(None)
