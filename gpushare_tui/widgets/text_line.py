"""A line (or a few) of Rich text that repaints without asking for a new layout.

`Static.update` refreshes the layout of the whole screen when the widget's size
is automatic; these lines have a fixed height, so a tick only repaints them.
"""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget


class TextLine(Widget):
    DEFAULT_CSS = """
    TextLine { height: 1; width: 1fr; }
    """

    def __init__(self, text: Text | str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self._text = Text(text) if isinstance(text, str) else text

    @property
    def text(self) -> Text:
        return self._text

    def set_text(self, text: Text) -> None:
        if text.plain != self._text.plain or text.spans != self._text.spans:
            self._text = text
            self.refresh()

    def render(self) -> Text:
        return self._text
