"""Segments that cannot be read: one red error row each, never a crash."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ..core.snapshot import SegmentProblem


class SegmentErrors(Static):
    DEFAULT_CSS = """
    SegmentErrors { height: auto; padding: 0 1; color: $error; }
    SegmentErrors.-empty { display: none; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self._errors: tuple[SegmentProblem, ...] | None = None
        self.add_class("-empty")

    def show(self, errors: tuple[SegmentProblem, ...]) -> None:
        if errors == self._errors:
            return
        self._errors = errors
        self.set_class(not errors, "-empty")
        t = Text()
        for i, e in enumerate(errors):
            if i:
                t.append("\n")
            t.append("✖ ", style="bold")
            t.append(e.segment, style="bold")
            t.append(f": {e.error} (skipped; the other segments are shown)")
        self.update(t)
