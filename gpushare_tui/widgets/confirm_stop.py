"""Confirmation before stopping a managed engine (`s`)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Label, Static

from ..dashboard.model import PeerRow
from .dialog import Dialog


class ConfirmStop(Dialog[bool]):
    DEFAULT_CSS = """
    ConfirmStop > Vertical { width: 60; border: thick $error; }
    """

    BINDINGS = [
        Binding("escape,n", "answer(False)", "No"),
        Binding("y", "answer(True)", "Yes"),
    ]

    def __init__(self, row: PeerRow) -> None:
        super().__init__()
        self.row = row

    def compose(self) -> ComposeResult:
        p = self.row.peer
        e = self.row.engine
        what = f" ({e.kind}, {e.model})" if e and e.kind and e.model else ""
        with Vertical():
            yield Label(f"Stop engine {p.name or ''} (pid {p.pid})?", classes="title", markup=False)
            yield Static(
                f"Slot {p.slot} on {self.row.gpu_key}{what}. The engine exits and leaves the registry; "
                "the others take over its share.",
                markup=False,
            )
            with Horizontal(classes="buttons"):
                yield Button("No", id="no")
                yield Button("Stop it (y)", id="yes", variant="error")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
