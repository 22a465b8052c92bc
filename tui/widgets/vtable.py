"""A virtualised table: rows come from a callback and only the visible ones are rendered, so a table of
100,000 steps costs what a table of 20 does (Textual's DataTable builds every row up front).

A `flex` column takes the width the others leave; in a table made with `wrap`, its text wraps onto as many
lines as it needs (sentences such as why a request waited are read whole, not cut at the column's edge).
Wrapping lays out every row, so it holds for up to WRAP_MAX_ROWS rows; a longer table keeps one line per
row."""
from __future__ import annotations

import bisect
import textwrap
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
WRAP_MAX_ROWS = 2000


@dataclass(slots=True)
class Column:
    title: str
    width: int  # a flex column's least width
    right: bool = False
    flex: bool = False


@lru_cache(maxsize=256)
def style_of(spec: str) -> Style:
    return Style.parse(spec) if spec else Style()


def _text(cell: Cell) -> str:
    return cell if isinstance(cell, str) else cell[0]


def _wrap(text: str, width: int) -> list[str]:
    return [text] if len(text) <= width else textwrap.wrap(text, width) or [""]


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

    def __init__(self, columns: Sequence[Column], empty: str = "(none)", wrap: bool = False, **kw) -> None:
        super().__init__(**kw)
        self.columns = list(columns)
        self.empty = empty
        self.wrap = wrap
        self.count = 0
        self.cursor = 0
        self._row: Callable[[int], Sequence[Cell]] = lambda i: ()
        self._style: Callable[[int], str] | None = None
        self._flex = next((k for k, c in enumerate(self.columns) if c.flex), None)
        self._widths = [c.width for c in self.columns]
        self._width = sum(self._widths) + len(self.columns) - 1
        # With wrapping: each row's flex-cell lines, and the first line of each row (and one past the last).
        self._wrapped: list[list[str]] | None = None
        self._first: list[int] = [0]

    # ---- data ----------------------------------------------------------------------------------
    def set_source(self, count: int, row: Callable[[int], Sequence[Cell]],
                   style: Callable[[int], str] | None = None, cursor: int | None = None) -> None:
        """Show `count` rows; `row(i)` gives cells, `style(i)` a style for the whole row."""
        self.count, self._row, self._style = count, row, style
        self._layout()
        self.move_cursor(self.cursor if cursor is None else cursor, notify=False)
        self.refresh()

    def _layout(self) -> None:
        """Column widths for the widget's width and, when wrapping, the lines of every row."""
        if self._flex is not None:
            rest = sum(c.width for c in self.columns if not c.flex) + len(self.columns) - 1
            self._widths[self._flex] = max(self.columns[self._flex].width, self.size.width - rest)
        self._width = sum(self._widths) + len(self.columns) - 1
        self._wrapped = None
        lines = self.count
        if self.wrap and self._flex is not None and self.count <= WRAP_MAX_ROWS:
            width = self._widths[self._flex]
            self._wrapped = [_wrap(_text(self._cell(i, self._flex)), width) for i in range(self.count)]
            self._first = [0]
            for w in self._wrapped:
                self._first.append(self._first[-1] + len(w))
            lines = self._first[-1]
        size = Size(self._width, lines + 1)
        if size != self.virtual_size:
            self.virtual_size = size

    def _cell(self, i: int, k: int) -> Cell:
        cells = self._row(i)
        return cells[k] if k < len(cells) else ""

    def _lines_of(self, i: int) -> tuple[int, int]:
        """The first line of row `i` and one past its last."""
        if self._wrapped is None:
            return i, i + 1
        return self._first[i], self._first[i + 1]

    def _row_at(self, line: int) -> tuple[int, int]:
        """The row on display line `line` (0: the first below the header) and which of its lines it is."""
        if self._wrapped is None:
            return line, 0
        i = bisect.bisect_right(self._first, line) - 1
        return i, line - self._first[i]

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
        first, end = self._lines_of(index) if self.count else (0, 1)
        if first < top:
            self.scroll_to(y=first, animate=False, immediate=True)
        elif end > top + rows:
            self.scroll_to(y=max(end - rows, 0) if end - first <= rows else first, animate=False, immediate=True)
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
            line = round(self.scroll_y) + event.y - 1
            if self._wrapped is None or line < self._first[-1]:
                self.move_cursor(self._row_at(line)[0])

    def on_resize(self) -> None:
        self._layout()
        self.move_cursor(self.cursor, notify=False)

    # ---- rendering -----------------------------------------------------------------------------
    def _strip(self, cells: Sequence[Cell], base: Style) -> Strip:
        segs = []
        for k, (col, width) in enumerate(zip(self.columns, self._widths)):
            cell = cells[k] if k < len(cells) else ""
            text, spec = (cell, "") if isinstance(cell, str) else cell
            if k:
                segs.append(Segment(" ", base))
            segs.append(Segment(_fit(text, width, col.right), base + style_of(spec) if spec else base))
        return Strip(segs, self._width)

    def _line_cells(self, i: int, sub: int) -> list[Cell]:
        """Row `i`'s cells on its line `sub`: the flex cell's wrapped line, the others on the first only."""
        cells = list(self._row(i))
        if self._wrapped is None:
            return cells
        k = self._flex
        assert k is not None
        cells += [""] * (k + 1 - len(cells))
        spec = cells[k][1] if isinstance(cells[k], tuple) else ""
        line = self._wrapped[i][sub]
        if sub:
            cells = [""] * len(cells)
        cells[k] = (line, spec) if spec else line
        return cells

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        sx = round(self.scroll_x)
        if y == 0:
            strip = self._strip([c.title for c in self.columns], style_of("bold"))
        else:
            line = round(self.scroll_y) + y - 1
            i, sub = self._row_at(line) if self.count else (line, 0)
            if i >= self.count or (self._wrapped is not None and line >= self._first[-1]):
                text = self.empty if (line == 0 and not self.count) else ""
                return Strip([Segment(text.ljust(width), style_of("dim"))], width)
            base = style_of(self._style(i) if self._style else "")
            if i == self.cursor:
                base += style_of("reverse" if self.has_focus else "on grey23")
            strip = self._strip(self._line_cells(i, sub), base)
        return strip.crop_extend(sx, sx + width, None)
