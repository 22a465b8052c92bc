"""A virtualised table: rows come from a callback and only the visible ones are rendered, so a table of
100,000 steps costs what a table of 20 does (Textual's DataTable builds every row up front)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

Cell = str | tuple[str, str]
"""A cell is text, or (text, rich style string)."""


@dataclass(slots=True)
class Column:
    title: str
    width: int
    right: bool = False


@lru_cache(maxsize=256)
def style_of(spec: str) -> Style:
    return Style.parse(spec) if spec else Style()


def _fit(text: str, width: int, right: bool) -> str:
    if len(text) > width:
        return text[: max(width - 1, 0)] + "…" if width > 1 else text[:width]
    return text.rjust(width) if right else text.ljust(width)


class VTable(ScrollView, can_focus=True, inherit_bindings=False):
    """Fixed columns, a sticky header row and a row cursor; left/right are left to the app."""

    BINDINGS = [
        Binding("up", "move(-1)", "Row up", show=False),
        Binding("down", "move(1)", "Row down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "edge(0)", "First row", show=False),
        Binding("end", "edge(1)", "Last row", show=False),
        Binding("enter", "choose", "Choose row", show=False),
    ]
    DEFAULT_CSS = """
    VTable { height: 1fr; scrollbar-size: 1 1; }
    """

    class Highlighted(Message):
        """The cursor moved to `index` by key or click (not by the app setting it), or enter chose it."""

        def __init__(self, table: VTable, index: int) -> None:
            super().__init__()
            self.table, self.index = table, index

        @property
        def control(self) -> VTable:
            return self.table

    def __init__(self, columns: Sequence[Column], empty: str = "(none)", **kw) -> None:
        super().__init__(**kw)
        self.columns = list(columns)
        self.empty = empty
        self.count = 0
        self.cursor = 0
        self._row: Callable[[int], Sequence[Cell]] = lambda i: ()
        self._style: Callable[[int], str] | None = None
        self._width = sum(c.width for c in self.columns) + len(self.columns) - 1

    # ---- data ----------------------------------------------------------------------------------
    def set_source(self, count: int, row: Callable[[int], Sequence[Cell]],
                   style: Callable[[int], str] | None = None, cursor: int | None = None) -> None:
        """Show `count` rows; `row(i)` gives cells, `style(i)` a style for the whole row."""
        self.count, self._row, self._style = count, row, style
        size = Size(self._width, count + 1)
        if size != self.virtual_size:
            self.virtual_size = size
        self.move_cursor(self.cursor if cursor is None else cursor, notify=False)
        self.refresh()

    def set_rows(self, rows: Sequence[Sequence[Cell]], styles: Sequence[str] | None = None,
                 cursor: int | None = None) -> None:
        self.set_source(len(rows), rows.__getitem__, styles.__getitem__ if styles else None, cursor)

    def cell_texts(self, i: int) -> list[str]:
        return [c if isinstance(c, str) else c[0] for c in self._row(i)]

    # ---- cursor --------------------------------------------------------------------------------
    def move_cursor(self, index: int, notify: bool = True) -> None:
        index = max(0, min(index, self.count - 1)) if self.count else 0
        changed = index != self.cursor
        self.cursor = index
        rows = max(self.size.height - 1, 1)
        top = round(self.scroll_y)
        if index < top:
            self.scroll_to(y=index, animate=False, immediate=True)
        elif index >= top + rows:
            self.scroll_to(y=index - rows + 1, animate=False, immediate=True)
        self.refresh()
        if notify and changed and self.count:
            self.post_message(self.Highlighted(self, index))

    def action_move(self, delta: int) -> None:
        self.move_cursor(self.cursor + delta)

    def action_choose(self) -> None:
        if self.count:
            self.post_message(self.Highlighted(self, self.cursor))

    def action_page(self, direction: int) -> None:
        self.move_cursor(self.cursor + direction * max(self.size.height - 2, 1))

    def action_edge(self, end: int) -> None:
        self.move_cursor(self.count - 1 if end else 0)

    def on_click(self, event: events.Click) -> None:
        if event.y >= 1:
            self.move_cursor(round(self.scroll_y) + event.y - 1)

    def on_resize(self) -> None:
        self.move_cursor(self.cursor, notify=False)

    # ---- rendering -----------------------------------------------------------------------------
    def _strip(self, cells: Sequence[Cell], base: Style) -> Strip:
        segs = []
        for k, col in enumerate(self.columns):
            cell = cells[k] if k < len(cells) else ""
            text, spec = (cell, "") if isinstance(cell, str) else cell
            if k:
                segs.append(Segment(" ", base))
            segs.append(Segment(_fit(text, col.width, col.right), base + style_of(spec) if spec else base))
        return Strip(segs, self._width)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        sx = round(self.scroll_x)
        if y == 0:
            strip = self._strip([c.title for c in self.columns], style_of("bold"))
        else:
            i = round(self.scroll_y) + y - 1
            if i >= self.count:
                text = self.empty if (i == 0 and not self.count) else ""
                return Strip([Segment(text.ljust(width), style_of("dim"))], width)
            base = style_of(self._style(i) if self._style else "")
            if i == self.cursor:
                base += style_of("reverse" if self.has_focus else "on grey23")
            strip = self._strip(self._row(i), base)
        return strip.crop_extend(sx, sx + width, None)
