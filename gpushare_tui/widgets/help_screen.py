"""`?`: an overlay listing every key."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

NAVIGATION = (
    ("↑ ↓ / mouse", "select a peer (the plots follow its GPU)"),
    ("PgUp PgDn Home End", "move in the peers table"),
    ("click a header", "sort by that column (again: reverse)"),
)


def help_table(keys: list[tuple[str, str, bool]], readonly: bool) -> Table:
    """keys: (key, what it does, is an admin action)."""
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    for key, what in NAVIGATION:
        t.add_row(key, what)
    t.add_row("", "")
    for key, what, admin in keys:
        if admin and readonly:
            t.add_row(Text(key, style="dim strike"), Text(f"{what} (disabled: --readonly)", style="dim"))
        else:
            t.add_row(key, what)
    return t


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 76; max-width: 100%; height: auto; max-height: 90%;
        padding: 1 2; border: thick $accent; background: $surface;
    }
    HelpScreen .title { text-style: bold; margin-bottom: 1; }
    HelpScreen .foot { color: $text-muted; margin-top: 1; }
    """

    BINDINGS = [Binding("escape,q,question_mark,enter", "close", "Close")]

    def __init__(self, keys: list[tuple[str, str, bool]], readonly: bool) -> None:
        super().__init__()
        self.keys = keys
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("gpushare-tui — keys", classes="title")
            yield Static(help_table(self.keys, self.readonly), id="help-keys")
            yield Static(
                "Timeline: each active peer's window in one TDM period, in its colour; ▼ marks now "
                "(who may run this instant). SHARE% = weight ÷ Σ weights of active peers; BUSY% = "
                "measured. Achieved share = tok/s ÷ Σ tok/s of the active peers (5 s average), shown "
                "when every active peer reports tok/s, against the configured share (dashed). "
                "ENGINE: running / stopped (paused outside its window) / loading. Foreign peers (no "
                "gpushare-tui control socket) are read-only. Esc / ? closes.",
                classes="foot",
            )

    def action_close(self) -> None:
        self.dismiss(None)
