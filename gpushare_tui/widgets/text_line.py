"""Lines of Rich text drawn through the Line API, repainted without a new layout.

The dashboard's per-tick lines (title bar, GPU info, timeline) change every
second. `Static.update` would ask for a new layout of the screen, and even a
plain `render()` goes through Textual's content pipeline each time; here the
text is turned into Strips once per change and served from that cache.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget


class TextLine(Widget):
    DEFAULT_CSS = """
    TextLine { height: 1; width: 1fr; }
    """

    def __init__(self, text: Text | str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self._text = Text(text) if isinstance(text, str) else text
        self._strips: list[Strip] | None = None
        self._strips_key: tuple | None = None

    @property
    def text(self) -> Text:
        return self._text

    def set_text(self, text: Text) -> None:
        if text.plain != self._text.plain or text.spans != self._text.spans:
            self._text = text
            self._strips = None
            self.refresh()

    def build_text(self, width: int) -> Text:
        """The text for this width (subclasses may lay out to the width)."""
        return self._text

    def _base_style(self) -> Style:
        return self.rich_style

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        key = (width, id(self._text))
        if self._strips is None or self._strips_key != key:
            base = self._base_style()
            console = self.app.console
            strips = []
            for line in self.build_text(width).split("\n", allow_blank=True):
                segments = list(Segment.apply_style(line.render(console), base))
                strips.append(Strip(segments).crop_extend(0, width, base))
            self._strips, self._strips_key = strips, key
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(width, self._base_style())

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips = None
