"""Edit one peer's weight. Validated here (finite, > 0, fits f32): errors inline, nothing sent."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, Static

from ..core.abi import BadWeightError, parse_weight
from ..dashboard.model import PeerRow
from .dialog import Dialog


class WeightModal(Dialog[float | None]):
    """Dismisses with the new weight, or None when cancelled."""

    DEFAULT_CSS = """
    WeightModal > Vertical { width: 56; }
    WeightModal Input { margin-top: 1; }
    WeightModal #weight-error { color: $error; height: auto; min-height: 1; margin-top: 1; }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, row: PeerRow) -> None:
        super().__init__()
        self.row = row

    def compose(self) -> ComposeResult:
        p = self.row.peer
        current = "invalid" if p.weight is None else f"{p.weight:g}"
        with Vertical():
            yield Label(f"Weight of {p.name or 'pid'} (pid {p.pid}, slot {p.slot})", classes="title")
            yield Static(f"now {current} → share {p.share_pct:.1f}%  ·  finite number > 0", classes="hint")
            yield Input(
                value="" if p.weight is None else f"{p.weight:g}",
                id="weight-input",
                placeholder="e.g. 2 or 0.5",
                select_on_focus=True,
            )
            yield Static("", id="weight-error")
            with Horizontal(classes="buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Set", id="ok", variant="primary")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def _submit(self) -> None:
        text = self.query_one(Input).value
        try:
            weight = parse_weight(text)
        except BadWeightError as e:
            self.query_one("#weight-error", Static).update(str(e))
            return
        self.dismiss(weight)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._submit()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.query_one("#weight-error", Static).update("")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "ok":
            self._submit()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)
