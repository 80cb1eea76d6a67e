"""The dashboard's modal dialogs share one look: a bordered box centred over the dimmed screen.

Each dialog composes one `Vertical` or `VerticalScroll` box, with an optional
`.title` label and a `.buttons` row; its own DEFAULT_CSS keeps only what
differs (width, border colour, its fields). Type selectors match subclasses,
and a subclass's DEFAULT_CSS wins over this one at equal specificity.
"""

from __future__ import annotations

from textual.screen import ModalScreen, ScreenResultType


class Dialog(ModalScreen[ScreenResultType]):
    DEFAULT_CSS = """
    Dialog { align: center middle; }
    Dialog > Vertical, Dialog > VerticalScroll {
        height: auto; max-width: 100%; padding: 1 2;
        border: thick $accent; background: $surface;
    }
    Dialog .title { text-style: bold; margin-bottom: 1; }
    Dialog Input { background: $boost; }
    Dialog Input:focus { background: $primary 30%; }
    Dialog .buttons { height: auto; margin-top: 1; align-horizontal: right; }
    Dialog Button { margin-left: 1; min-width: 10; }
    """
