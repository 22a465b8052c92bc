"""The KV block pool as a map, one cell per block, virtualised: only the visible rows are drawn, so an
8192+ block pool scrolls as cheaply as a small one. Cell codes come from a numpy array; runs of equal
cells become one segment."""
from __future__ import annotations

from itertools import groupby

import numpy as np
from rich.segment import Segment
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from traces.blocks import PoolState
from tui.widgets.vtable import style_of

FREE, CACHED, HELD, SHARED = 0, 1, 2, 3
MINE = 4
GLYPHS = {FREE: ("·", "grey37"), CACHED: ("○", "dodger_blue1"), HELD: ("█", "green3"), SHARED: ("▓", "yellow"),
          FREE | MINE: ("·", "magenta"), CACHED | MINE: ("○", "magenta"), HELD | MINE: ("█", "magenta"),
          SHARED | MINE: ("▓", "bright_magenta")}
LEGEND = (("█", "green3", "held"), ("▓", "yellow", "shared"), ("○", "dodger_blue1", "cached-free"),
          ("·", "grey37", "free"), ("█", "magenta", "selected request"))


def cell_codes(pool: PoolState, mine: str | None) -> np.ndarray:
    """State code per block (index = block id - 1), with MINE set on blocks the selected request holds."""
    refs = pool.ref_counts()
    codes = np.where(refs > 1, SHARED, np.where(refs == 1, HELD, np.where(pool.cached_flags(), CACHED, FREE)))
    codes = codes.astype(np.int8)
    if mine is not None:
        codes[pool.held_by(mine)] |= MINE
    return codes


class BlockMap(ScrollView, can_focus=True, inherit_bindings=False):
    """Arrow keys move a block cursor; enter asks the app to select one of the block's holders."""

    BINDINGS = [
        Binding("up", "move(0, -1)", "Block up", show=False),
        Binding("down", "move(0, 1)", "Block down", show=False),
        Binding("left", "move(-1, 0)", "Block left", show=False),
        Binding("right", "move(1, 0)", "Block right", show=False),
        Binding("pageup", "move(0, -10)", "10 rows up", show=False),
        Binding("pagedown", "move(0, 10)", "10 rows down", show=False),
        Binding("enter", "pick", "Select holder", show=False),
    ]
    DEFAULT_CSS = """
    BlockMap { height: 1fr; scrollbar-size: 1 1; }
    """

    class Moved(Message):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    class Picked(Message):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.codes = np.zeros(0, np.int8)
        self.cursor = 0

    @property
    def cols(self) -> int:
        return max(self.size.width, 1)

    def set_codes(self, codes: np.ndarray) -> None:
        self.codes = codes
        self.cursor = min(self.cursor, max(len(codes) - 1, 0))
        self._resize_virtual()
        self.refresh()

    def _resize_virtual(self) -> None:
        self.virtual_size = Size(self.cols, -(-len(self.codes) // self.cols))

    def on_resize(self, event: events.Resize) -> None:
        self._resize_virtual()

    def move_to(self, index: int) -> None:
        if not len(self.codes):
            return
        self.cursor = max(0, min(index, len(self.codes) - 1))
        row, rows = self.cursor // self.cols, max(self.size.height, 1)
        top = round(self.scroll_y)
        if row < top:
            self.scroll_to(y=row, animate=False, immediate=True)
        elif row >= top + rows:
            self.scroll_to(y=row - rows + 1, animate=False, immediate=True)
        self.refresh()
        self.post_message(self.Moved(self.cursor))

    def action_move(self, dx: int, dy: int) -> None:
        self.move_to(self.cursor + dx + dy * self.cols)

    def action_pick(self) -> None:
        self.post_message(self.Picked(self.cursor))

    def on_click(self, event: events.Click) -> None:
        index = (round(self.scroll_y) + event.y) * self.cols + event.x
        if 0 <= event.x < self.cols and index < len(self.codes):
            self.move_to(index)

    def render_line(self, y: int) -> Strip:
        cols = self.cols
        lo = (round(self.scroll_y) + y) * cols
        row = self.codes[lo:lo + cols].tolist()
        segs = []
        k = 0
        for code, run in groupby(row):
            n = len(list(run))
            glyph, colour = GLYPHS[code]
            if lo + k <= self.cursor < lo + k + n:
                at = self.cursor - lo - k
                if at:
                    segs.append(Segment(glyph * at, style_of(colour)))
                segs.append(Segment(glyph, style_of(f"reverse bold {colour}")))
                if n - at - 1:
                    segs.append(Segment(glyph * (n - at - 1), style_of(colour)))
            else:
                segs.append(Segment(glyph * n, style_of(colour)))
            k += n
        return Strip(segs, k).extend_cell_length(cols)
