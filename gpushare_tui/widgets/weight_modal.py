"""Edit one peer's weight. Validated here (finite, > 0, fits f32): errors inline, nothing sent.

As you type, the dialog previews the share the new weight would give, from the
weights of the GPU's other members when the dialog opened: its window share (the
schedule's w ÷ Σw with the 10 % floor), and w ÷ Σw when the floor makes them differ.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, Static

from ..core.observe.snapshot import floor_lifted
from ..core.registry.abi import BadWeightError, parse_weight
from ..core.schedule.v1 import window_shares
from ..dashboard.model import GpuView, PeerRow
from .dialog import Dialog


def others_weights(row: PeerRow, view: GpuView | None) -> list[float]:
    """The weights of the schedule's other members (peers with a window) on the row's GPU."""
    if view is None:
        return []
    return [
        r.peer.weight
        for r in view.rows
        if r.peer.slot != row.peer.slot and r.peer.window_pct is not None and r.peer.weight is not None
    ]


def share_text(window_pct: float, share_pct: float) -> str:
    """`share 90.0%`, with w ÷ Σw beside it when the floor (min(10 %, 1/n), spec §5.3) makes them differ."""
    if abs(window_pct - share_pct) < 0.05:
        return f"share {window_pct:.1f}%"
    why = "lifted by the floor" if floor_lifted(share_pct, window_pct) else "less the others' floor"
    return f"share {window_pct:.1f}% (w ÷ Σw {share_pct:.1f}%, {why})"


def share_preview(text: str, others: Sequence[float], member: bool) -> tuple[str, bool]:
    """(what the dialog says about `text`, valid): the resulting share %, or why it is invalid."""
    try:
        w = parse_weight(text)
    except BadWeightError as e:
        return str(e), False
    total = sum(others)
    pct = 100.0 * w / (total + w)
    window = 100.0 * window_shares([w, *others])[0]
    alone = "  (no other member)" if not others else f"  (others' weights: {total:g})"
    return f"→ {share_text(window, pct)}{'' if member else ' once active'}{alone}", True


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
        self.others = others_weights(row, view)
        self.member = row.peer.window_pct is not None

    def compose(self) -> ComposeResult:
        p = self.row.peer
        current = "invalid" if p.weight is None else f"{p.weight:g}"
        text = "" if p.weight is None else f"{p.weight:g}"
        with Vertical():
            yield Label(f"Weight of {p.name or 'pid'} (pid {p.pid}, slot {p.slot})", classes="title", markup=False)
            now = "not active: no window" if p.window_pct is None else share_text(p.window_pct, p.share_pct)
            yield Static(f"now {current} → {now}  ·  finite number > 0", classes="hint")
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
