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

from ..core.schedule.v1 import PERIOD_MAX_MS, PERIOD_MIN_MS
from ..dashboard.columns import COLUMNS
from ..dashboard.history import ACHIEVED_AVG_S
from ..dashboard.strobe import STROBE_STEPS, Strobe
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


def column_table() -> Table:
    """Every column of the peers table and what it shows (dashboard.columns: one place, so a new column
    is defined here by its own `help`)."""
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    for c in COLUMNS:
        t.add_row(c.label, c.help)
    return t


def screen_text() -> str:
    """The timeline, the strobe and the plots, in words."""
    fastest, slowest = (Strobe(ms * 1000).slowdown for ms in (PERIOD_MAX_MS, PERIOD_MIN_MS))
    return (
        "Timeline: each active peer's window in one TDM period, in its colour; ▼ marks who may run at that "
        f"instant. A period ({PERIOD_MIN_MS}-{PERIOD_MAX_MS} ms) is too fast to watch, so the cursor is a strobe: "
        f"each frame is the true schedule whole periods + 1/{STROBE_STEPS} of a period after the last, so it "
        f'sweeps the period in {STROBE_STEPS} frames; "strobe N× slower" says how much slower than real time '
        f"it moves ({fastest:.0f}-{slowest:.0f}×, by the period). Plots: share % is each peer's SHR% (its window), "
        f"busy % its BSY%, achieved its ACH% as a {ACHIEVED_AVG_S:g} s average against the share its weight "
        'gives (SHR%, dashed: "configured"). '
        f"On a narrow terminal {', '.join(c.label for c in sorted(COLUMNS, key=lambda c: -c.drop) if c.drop)} are "
        "left out. Esc / ? closes."
    )


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
            yield Static("Columns", classes="title")
            yield Static(column_table(), id="help-columns")
            yield Static(screen_text(), classes="foot", id="help-screen-text")

    def action_close(self) -> None:
        self.dismiss(None)
