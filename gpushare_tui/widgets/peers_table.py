"""The peers table: one row per registered peer of every shown GPU, updated in place.

Sortable (click a header, or `o` to cycle), row selection by arrows and mouse.
Rows are keyed by (gpu, slot, pid, boot) so the selection survives refreshes
and re-sorting.

It is a Line-API widget rather than a DataTable: a DataTable drops every
cell's render cache on any cell update, so a 1 Hz refresh re-rendered every
visible cell through Rich each tick. Here each row is one cached Strip,
rebuilt only when that row's text (or its selection) changes.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import JustifyMethod
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ..dashboard.columns import (
    CLASS_LEGEND,
    COLUMN_BY_KEY,
    COLUMNS,
    GAP,
    LATENCY_KEYS,
    Column,
    fit_columns,
    latency_reported,
)
from ..dashboard.model import PeerRow
from .palette import slot_colour

SORT_CYCLE = ("slot", "share", "busy", "weight", "toks", "speed", "name", "pid")
_INDEX = {c.key: i for i, c in enumerate(COLUMNS)}
_KEYS = tuple(c.key for c in COLUMNS)
_JUSTIFY: dict[str, JustifyMethod] = {c.key: "right" if c.right else "left" for c in COLUMNS}
_ENGINE_STYLE = {"running": "green", "loading": "yellow", "stopped": "yellow", "exiting": "yellow"}
# engine_text's cases other than a state (dead, foreign, not asked yet, no reply, differs from its file)
_ENGINE_CASE_STYLE = {"-": "dim", "read-only": "dim italic", "…": "dim", "no reply": "red", "up ≠file": "yellow"}
STRIP_CACHE_SIZE = 1024  # row strips kept (as Textual's Log): more than a screen shows, however many rows come and go


def _engine_style(r: PeerRow, text: str) -> str:
    """The style of the ENGINE cell whose text (columns.engine_text) is `text`."""
    if text in _ENGINE_CASE_STYLE:
        return _ENGINE_CASE_STYLE[text]
    return _ENGINE_STYLE.get(r.engine.state or "", "") if r.engine is not None else ""


def row_cells(r: PeerRow, texts: tuple[str, ...] | None = None) -> tuple[Text, ...]:
    """The rendered cells of one row, in COLUMNS order (pure): the columns' text, styled. `texts`: the columns'
    text already made for the row (its display_key's), not made again."""
    p = r.peer
    dead = not p.alive
    base = "dim" if dead else ""
    colour = slot_colour(p.slot)
    plain = dict(zip(_KEYS, texts if texts is not None else (c.text(r) for c in COLUMNS), strict=True))
    width = COLUMN_BY_KEY["slot"].width
    swatch = Text.assemble(("■", colour), plain["slot"].rjust(width - 2))
    if p.alive:
        status = Text(plain["status"], style="bold green" if p.active else "yellow")
    else:
        status = Text(plain["status"], style="bold red")
    cells = {k: Text(v, justify=_JUSTIFY[k], style=base) for k, v in plain.items()}
    cells.update(
        slot=swatch,
        name=Text(plain["name"], style=f"{base} {colour}".strip(), overflow="ellipsis", no_wrap=True),
        weight=Text(plain["weight"], justify="right", style=base if p.weight is not None else "red"),
        share=Text(plain["share"], justify="right", style=f"bold {base}".strip()),
        status=status,
        hb=Text(plain["hb"], justify="right", style="red" if dead else base),
        engine=Text(plain["engine"], style=_engine_style(r, plain["engine"])),
        gpu=Text(plain["gpu"], style="dim", overflow="ellipsis", no_wrap=True),
    )
    cells["class"] = Text(plain["class"], style=_class_style(r) if p.alive else base)  # latency class (issue 20)
    return tuple(cells[c.key] for c in COLUMNS)


def _class_style(r: PeerRow) -> str:
    """The CLS cell: bold magenta while it holds priority, magenta for an interactive peer, dim for a v1 peer."""
    p = r.peer
    if p.klass is None:
        return "dim"
    return "bold magenta" if p.priority else "magenta" if p.klass == "interactive" else ""


def display_key(r: PeerRow) -> tuple:
    """Everything a row shows, as plain values: each column's own text (COLUMNS, the one definition of what a
    cell says) and what picks the styles `row_cells` adds. Equal keys render equal rows; a new column or a
    cell whose text changes changes the key without being listed here."""
    p = r.peer
    texts = tuple(c.text(r) for c in COLUMNS)
    styles = (p.alive, p.active, p.weight is None, _engine_style(r, texts[_INDEX["engine"]]), _class_style(r))
    return (r.gpu_key, texts, styles)


def header_cells(sort_column: str, reverse: bool, width: int) -> tuple[tuple[Text, ...], tuple[int, str] | None]:
    """The header's cells, the sorted one's label underlined with the sort arrow touching it: in its
    padding (before a right-justified label, after a left-justified one), else in the blank before it.
    Returns the cells and the `mark` (cell index, arrow) for that blank, or None."""
    arrow = "▼" if reverse else "▲"
    cells = []
    mark = None
    for i, c in enumerate(COLUMNS):
        justify: JustifyMethod = "right" if c.right else "left"
        if c.key != sort_column:
            cells.append(Text(c.label, justify=justify))
            continue
        label = Text(c.label, style="underline", justify=justify)
        if cell_len(c.label) < width:
            label = Text.assemble(arrow, label) if c.right else Text.assemble(label, arrow)
            label.justify = justify
        else:
            mark = (i, arrow)
        cells.append(label)
    return tuple(cells), mark


def cell_text(r: PeerRow, column: str) -> str:
    """The plain text of one dashboard cell (for tests and tools)."""
    return row_cells(r)[_INDEX[column]].plain


class PeersTable(ScrollView, can_focus=True):
    """`show(rows)` replaces the data; the header stays on line 0 while rows scroll."""

    COMPONENT_CLASSES = {"peers-table--header", "peers-table--cursor", "peers-table--cursor-blurred"}

    DEFAULT_CSS = """
    PeersTable {
        height: auto;
        max-height: 100%;
        overflow-x: hidden;
        scrollbar-size-vertical: 1;
        background: $surface;
        & > .peers-table--header { text-style: bold; color: $text-primary; background: $panel; }
        & > .peers-table--cursor { background: $accent 35%; text-style: bold; }
        & > .peers-table--cursor-blurred { background: $accent 15%; }
    }
    """

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", show=False),
        Binding("pagedown", "page(1)", show=False),
        Binding("home", "edge(0)", show=False),
        Binding("end", "edge(1)", show=False),
    ]

    class Highlighted(Message):
        """The selected row changed (its key, or None when the table is empty)."""

        def __init__(self, table: PeersTable, key: str | None) -> None:
            super().__init__()
            self.table = table
            self.key = key

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._rows: dict[str, PeerRow] = {}
        self._cells: dict[str, tuple[Text, ...]] = {}
        self._keys: dict[str, tuple] = {}
        self._order: list[str] = []
        self._strips: LRUCache[tuple[str, int], Strip] = LRUCache(STRIP_CACHE_SIZE)  # (row key, selection)
        self._header_strip: Strip | None = None
        self._styles: tuple[Style, Style, Style] | None = None
        self._style_cache: dict[tuple[Style, object], Style] = {}
        self.sort_column = "slot"
        self.sort_reverse = False
        self.selected_key: str | None = None
        self.cursor_row = 0
        self._fitted_to: tuple[int, frozenset[str]] = (-1, frozenset())  # what the columns were fitted to
        self._empty: frozenset[str] = frozenset()  # columns with nothing to show (VRAM without NVML)
        self._shown: tuple[Column, ...] = COLUMNS
        self._layout: list[tuple[int, int]] = [(_INDEX[c.key], c.width) for c in COLUMNS]  # (cell index, width)
        self._width = sum(w + GAP for _, w in self._layout)
        self.virtual_size = Size(self._width, 1)

    # -- data --------------------------------------------------------------

    @property
    def row_count(self) -> int:
        return len(self._order)

    @property
    def order(self) -> list[str]:
        return list(self._order)

    def row(self, key: str | None) -> PeerRow | None:
        return self._rows.get(key) if key is not None else None

    @property
    def selected_row(self) -> PeerRow | None:
        return self.row(self.selected_key)

    def cells(self, key: str) -> tuple[Text, ...]:
        cells = self._cells.get(key)
        if cells is None:
            cells = self._cells[key] = row_cells(self._rows[key], self._keys[key][1])  # its key holds the texts
        return cells

    def show(self, rows: tuple[PeerRow, ...]) -> None:
        """Show `rows`: rebuild only the rows whose text changed; keep order and selection.

        Change detection uses `display_key` (plain values, cheap); a row's cells
        and strip are built only when it is drawn.
        """
        new = {r.key: r for r in rows}
        empty = frozenset() if any(r.vram_mib is not None for r in rows) else frozenset({"vram"})
        if not any(r.account is not None and r.account.energy_j is not None for r in rows):
            empty |= {"energy"}  # no energy source (NVML's energy counter, RAPL)
        if not latency_reported(rows):
            empty |= LATENCY_KEYS  # no engine behind a front proxy reports its clients' latency
        if empty != self._empty:
            self._empty = empty
            self._fit()
        changed: list[str] = []
        removed = [k for k in self._rows if k not in new]
        for gone in removed:
            del self._rows[gone], self._keys[gone]
            self._cells.pop(gone, None)
            self._drop_strips(gone)
        for k, r in new.items():
            dk = display_key(r)
            if self._keys.get(k) != dk:
                self._keys[k] = dk
                self._cells.pop(k, None)
                changed.append(k)
                self._drop_strips(k)
            self._rows[k] = r
        if not changed and not removed:
            return
        n_before, old_order = len(self._order), self._order
        self._order = self._sorted_keys()
        if len(self._order) != n_before:
            self.virtual_size = Size(self._width, len(self._order) + 1)
            self.refresh(layout=True)
        self._restore_cursor()
        if self._order != old_order:
            self.refresh()
            return
        top = round(self.scroll_y)
        height = self.scrollable_content_region.height
        index = {k: i for i, k in enumerate(self._order)}
        for k in changed:  # repaint only the changed rows that are on screen
            y = index[k] - top + 1
            if 1 <= y < height:
                self.refresh(Region(0, y, self.size.width, 1))

    def _drop_strips(self, key: str) -> None:
        for selected in (0, 1, 2):
            self._strips.discard((key, selected))

    def _sorted_keys(self) -> list[str]:
        col = COLUMN_BY_KEY[self.sort_column]
        tie = COLUMN_BY_KEY["slot"].sort
        keys = sorted(self._rows, key=lambda k: tie(self._rows[k]))
        keys.sort(key=lambda k: col.sort(self._rows[k]), reverse=self.sort_reverse)
        return keys

    def _restore_cursor(self) -> None:
        """Keep the selected key selected; if it left, keep the cursor's position."""
        if self.selected_key in self._rows:
            self.cursor_row = self._order.index(self.selected_key)
            return
        if not self._order:
            if self.selected_key is not None:
                self.selected_key = None
                self.post_message(self.Highlighted(self, None))
            return
        self.cursor_row = max(0, min(self.cursor_row, len(self._order) - 1))
        self.selected_key = self._order[self.cursor_row]
        self.post_message(self.Highlighted(self, self.selected_key))

    # -- selection ---------------------------------------------------------

    def select_index(self, index: int) -> None:
        if not self._order:
            return
        index = max(0, min(index, len(self._order) - 1))
        key = self._order[index]
        moved = key != self.selected_key
        self.cursor_row = index
        self.selected_key = key
        self._scroll_to_cursor()
        self.refresh()
        if moved:
            self.post_message(self.Highlighted(self, key))

    def select_key(self, key: str) -> None:
        if key in self._rows:
            self.select_index(self._order.index(key))

    def _scroll_to_cursor(self) -> None:
        visible = max(1, self.scrollable_content_region.height - 1)
        top = round(self.scroll_y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= top + visible:
            self.scroll_to(y=self.cursor_row - visible + 1, animate=False)

    def action_cursor(self, delta: int) -> None:
        self.select_index(self.cursor_row + delta)

    def action_page(self, direction: int) -> None:
        self.select_index(self.cursor_row + direction * max(1, self.scrollable_content_region.height - 2))

    def action_edge(self, end: int) -> None:
        self.select_index(len(self._order) - 1 if end else 0)

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        if offset.y == 0:
            column = self._column_at(offset.x + round(self.scroll_x))
            if column is not None:
                self.sort_by(column)
            return
        self.select_index(round(self.scroll_y) + offset.y - 1)

    def _column_at(self, x: int) -> str | None:
        pos = 0
        for i, w in self._layout:
            c = COLUMNS[i]
            pos += w + GAP
            if x < pos:
                return c.key
        return None

    # -- sorting -----------------------------------------------------------

    def sort_by(self, column: str, reverse: bool | None = None) -> None:
        col = COLUMN_BY_KEY[column]
        if reverse is None:
            reverse = (not self.sort_reverse) if column == self.sort_column else col.descending
        self.sort_column, self.sort_reverse = column, reverse
        self._header_strip = None
        self._order = self._sorted_keys()
        self._restore_cursor()
        self._scroll_to_cursor()
        self.refresh()

    def cycle_sort(self) -> str:
        i = SORT_CYCLE.index(self.sort_column) if self.sort_column in SORT_CYCLE else -1
        column = SORT_CYCLE[(i + 1) % len(SORT_CYCLE)]
        self.sort_by(column, COLUMN_BY_KEY[column].descending)
        return column

    # -- rendering ---------------------------------------------------------

    def _row_segments(self, cells: tuple[Text, ...], base: Style, mark: tuple[int, str] | None = None) -> list[Segment]:
        """One row as Segments, built directly (the hot path: no Rich layout per cell):
        one segment per plain cell, its padding included, in `base` + the cell's style.

        Each cell is preceded by one blank (GAP); `mark` = (cell index, char) puts a char
        there (the header's sort arrow), so labels are never truncated for it.
        """
        console = self.app.console
        styles = self._style_cache
        out: list[Segment] = []
        for i, width in self._layout:
            cell = cells[i]
            plain = cell.plain
            if cell_len(plain) > width:
                cell = cell.copy()
                cell.truncate(width, overflow="ellipsis")
                plain = cell.plain
            pad = " " * (width - cell_len(plain))
            right_justified = cell.justify == "right"
            before = mark[1] if mark is not None and mark[0] == i else " "
            key = (base, cell.style)
            style = styles.get(key)
            if style is None:
                style = styles[key] = base + console.get_style(cell.style) if cell.style else base
            if cell.spans:
                out.append(Segment(before + (pad if right_justified else ""), style))
                out.extend(
                    Segment(seg.text, style + seg.style if seg.style else style)
                    for seg in cell.render(console)
                    if seg.text
                )
                if not right_justified and pad:
                    out.append(Segment(pad, style))
            elif right_justified:
                out.append(Segment(before + pad + plain, style))
            else:
                out.append(Segment(before + plain + pad, style))
        return out

    def _render_row(self, cells: tuple[Text, ...], style: Style, mark: tuple[int, str] | None = None) -> Strip:
        return Strip(self._row_segments(cells, style, mark), self._width)

    def _header(self) -> Strip:
        if self._header_strip is None:
            widths = {i: w for i, w in self._layout}
            col = _INDEX[self.sort_column]
            cells, mark = header_cells(self.sort_column, self.sort_reverse, widths.get(col, COLUMNS[col].width))
            style = self.get_component_rich_style("peers-table--header")
            self._header_strip = self._render_row(cells, style, mark)
        return self._header_strip

    def _row_strip(self, key: str, selected: int) -> Strip:
        strip = self._strips.get((key, selected))
        if strip is None:
            style = self._row_styles()[selected]
            strip = self._render_row(self.cells(key), style)
            self._strips[(key, selected)] = strip
        return strip

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        if width != self._fitted_to[0]:  # a vertical scrollbar came or went
            self._fit()
        if y == 0:
            strip = self._header()
        else:
            i = scroll_y + y - 1
            if i >= len(self._order):
                return Strip.blank(width, self._row_styles()[0])
            key = self._order[i]
            selected = 0 if i != self.cursor_row else (1 if self.has_focus else 2)
            strip = self._row_strip(key, selected)
        return strip.crop_extend(scroll_x, scroll_x + width, self._row_styles()[0])

    def _row_styles(self) -> tuple[Style, Style, Style]:
        """(plain, cursor, blurred cursor) row styles; cached: computing a widget's style walks the DOM."""
        if self._styles is None:
            base = self.rich_style
            self._styles = (
                base,
                base + self.get_component_rich_style("peers-table--cursor"),
                base + self.get_component_rich_style("peers-table--cursor-blurred"),
            )
        return self._styles

    def _fit(self) -> None:
        """Choose the columns and NAME's width for the content width: never wider than it (no
        horizontal scrolling at >= 80 terminal columns; the least useful columns go first)."""
        available = self.scrollable_content_region.width
        if (available, self._empty) == self._fitted_to or available <= 0:
            return
        self._fitted_to = (available, self._empty)
        shown, name = fit_columns(available, self._empty)
        layout = [(_INDEX[c.key], name if c.key == "name" else c.width) for c in shown]
        if layout != self._layout:
            self._shown, self._layout = shown, layout
            # the CLS cell's short forms explained where they stand: under the table, while CLS is shown
            self.border_subtitle = CLASS_LEGEND if any(c.key == "class" for c in shown) else ""
            self._width = sum(w + GAP for _, w in layout)
            self.virtual_size = Size(self._width, len(self._order) + 1)
            self._strips.clear()
            self._header_strip = None
            self.refresh()

    @property
    def shown_columns(self) -> tuple[str, ...]:
        """The keys of the columns shown now, in order."""
        return tuple(c.key for c in self._shown)

    def on_resize(self) -> None:
        self._fit()

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()
        self._header_strip = None
        self._styles = None
        self._style_cache.clear()
