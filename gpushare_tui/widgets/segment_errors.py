"""Segments that cannot be read: one red error row each, never a crash."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ..core.observe.snapshot import SegmentProblem, foreign_not_shown_text


class SegmentErrors(Static):
    DEFAULT_CSS = """
    SegmentErrors { height: auto; padding: 0 1; color: $error; }
    SegmentErrors.-empty { display: none; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self._shown: tuple[tuple[SegmentProblem, ...], int] | None = None
        self.add_class("-empty")

    def show(self, errors: tuple[SegmentProblem, ...], foreign_not_shown: int = 0) -> None:
        """One row per error, then one line counting the segments of other users not shown (if any)."""
        if (errors, foreign_not_shown) == self._shown:
            return
        self._shown = (errors, foreign_not_shown)
        self.set_class(not errors and not foreign_not_shown, "-empty")
        t = Text()
        for i, e in enumerate(errors):
            if i:
                t.append("\n")
            t.append("✖ ", style="bold")
            t.append(e.segment, style="bold")
            t.append(f": {e.error} (skipped; the other segments are shown)")
        if foreign_not_shown:
            if errors:
                t.append("\n")
            t.append(foreign_not_shown_text(foreign_not_shown), style="dim")
        self.update(t)
