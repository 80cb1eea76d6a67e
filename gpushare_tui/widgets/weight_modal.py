"""Edit one peer's weight. Validated here (finite, > 0, fits f32): errors inline, nothing sent.

As you type, the dialog previews the share the new weight would give, from the
weights of the GPU's other members when the dialog opened: w ÷ (Σ others + w).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, Static

from ..core.abi import BadWeightError, parse_weight
from ..dashboard.model import GpuView, PeerRow
from .dialog import Dialog


def others_weight(row: PeerRow, view: GpuView | None) -> float:
    """Σ weights of the schedule's other members (peers with a share) on the row's GPU."""
    if view is None:
        return 0.0
    return sum(
        r.peer.weight
        for r in view.rows
        if r.peer.slot != row.peer.slot and r.peer.share_pct > 0 and r.peer.weight is not None
    )


def share_preview(text: str, others: float, member: bool) -> tuple[str, bool]:
    """(what the dialog says about `text`, valid): the resulting share %, or why it is invalid."""
    try:
        w = parse_weight(text)
    except BadWeightError as e:
        return str(e), False
    pct = 100.0 * w / (others + w)
    alone = "  (no other member)" if others == 0 else f"  (others' weights: {others:g})"
    return f"→ share {pct:.1f}%{'' if member else ' once active'}{alone}", True


class WeightModal(Dialog[float | None]):
    """Dismisses with the new weight, or None when cancelled."""

    DEFAULT_CSS = """
    WeightModal > Vertical { width: 56; }
    WeightModal Input { margin-top: 1; }
    WeightModal #weight-preview { height: auto; min-height: 1; margin-top: 1; }
    WeightModal #weight-preview.-invalid { color: $error; }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, row: PeerRow, view: GpuView | None = None) -> None:
        """`view`: the row's GPU, for the share preview (without it, as if the peer ran alone)."""
        super().__init__()
        self.row = row
        self.others = others_weight(row, view)
        self.member = row.peer.share_pct > 0

    def compose(self) -> ComposeResult:
        p = self.row.peer
        current = "invalid" if p.weight is None else f"{p.weight:g}"
        text = "" if p.weight is None else f"{p.weight:g}"
        with Vertical():
            yield Label(f"Weight of {p.name or 'pid'} (pid {p.pid}, slot {p.slot})", classes="title", markup=False)
            yield Static(f"now {current} → share {p.share_pct:.1f}%  ·  finite number > 0", classes="hint")
            yield Input(value=text, id="weight-input", placeholder="e.g. 2 or 0.5", select_on_focus=True)
            yield Static(id="weight-preview")
            with Horizontal(classes="buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Set", id="ok", variant="primary")

    def on_mount(self) -> None:
        self._preview(self.query_one(Input).value)
        self.query_one(Input).focus()

    def _preview(self, text: str) -> bool:
        said, ok = share_preview(text, self.others, self.member)
        preview = self.query_one("#weight-preview", Static)
        preview.update(said)
        preview.set_class(not ok, "-invalid")
        return ok

    def _submit(self) -> None:
        text = self.query_one(Input).value
        if self._preview(text):
            self.dismiss(parse_weight(text))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._submit()

    def on_input_changed(self, event: Input.Changed) -> None:
        self._preview(event.value)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "ok":
            self._submit()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)
