"""The whole run as sparklines (step time, tokens, KV usage, queue lengths) with a cursor column and
marks for preemptions and divergences. Each column is the maximum over its bucket of steps, computed
once per width with `np.maximum.reduceat`; zoom shows one step per column around the cursor."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.text import Text
from textual.widget import Widget

BARS = " ▁▂▃▄▅▆▇█"
LABEL, VALUE = 9, 14


@dataclass(slots=True)
class Series:
    """One sparkline: values per step, how to print the cursor's value, and the value of a full bar
    (None: the series' maximum)."""
    label: str
    values: np.ndarray
    fmt: str
    colour: str
    top: float | None = None


class Timeline(Widget):
    DEFAULT_CSS = """
    Timeline { height: 6; padding: 0 1; }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.series: list[Series] = []
        self.marks: list[tuple[np.ndarray, str, str]] = []
        self.n = 0
        self.cursor = 0
        self.zoom = False
        self._buckets: dict[int, tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]] = {}

    def set_data(self, series: list[Series], marks: list[tuple[np.ndarray, str, str]]) -> None:
        """marks: (sorted step positions, glyph, colour) drawn on the ruler line."""
        self.series, self.marks = series, marks
        self.n = len(series[0].values) if series else 0
        self._buckets.clear()
        self.refresh()

    def set_cursor(self, pos: int) -> None:
        self.cursor = max(0, min(pos, self.n - 1))
        self.refresh()

    def _edges(self, width: int) -> np.ndarray:
        if self.zoom or self.n <= width:
            lo = max(0, min(self.cursor - width // 2, self.n - width)) if self.zoom else 0
            return np.arange(lo, min(lo + width, self.n) + 1)
        return (np.arange(width + 1) * self.n) // width

    def _bucketed(self, width: int) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
        """Bucket edges, per-series levels 0..8 and per-mark hit flags; cached unless zoomed."""
        if not self.zoom and width in self._buckets:
            return self._buckets[width]
        edges = self._edges(width)
        starts = edges[:-1]
        levels = []
        for s in self.series:
            top = s.top if s.top is not None else (float(np.max(s.values)) if len(s.values) else 0.0)
            window = s.values[edges[0]:edges[-1]]
            peak = np.maximum.reduceat(window, starts - edges[0]) if len(starts) else np.zeros(0)
            levels.append(np.ceil(peak / top * 8).astype(int) if top > 0 else np.zeros(len(starts), int))
        hits = [np.searchsorted(pos, edges[1:]) > np.searchsorted(pos, starts) for pos, _, _ in self.marks]
        out = (edges, levels, hits)
        if not self.zoom:
            self._buckets[width] = out
        return out

    def render(self) -> Text:
        width = max(self.size.width - LABEL - VALUE, 1)
        text = Text(no_wrap=True, overflow="crop")
        if not self.n:
            return text.append("(no steps)")
        edges, levels, hits = self._bucketed(width)
        col = int(np.searchsorted(edges, self.cursor, side="right")) - 1
        for s, level in zip(self.series, levels):
            text.append(f"{s.label:<{LABEL}}", "bold")
            line = Text("".join(BARS[v] for v in np.clip(level, 0, 8)), s.colour)
            line.stylize("reverse", col, col + 1)
            text.append_text(line)
            text.append(f" {s.fmt.format(s.values[self.cursor]):>{VALUE - 1}}\n")
        ruler = [" "] * len(edges[:-1])
        styles: dict[int, str] = {}
        for (_, glyph, colour), hit in zip(self.marks, hits):
            for k in np.flatnonzero(hit):
                ruler[k], styles[k] = glyph, colour
        if 0 <= col < len(ruler):
            ruler[col], styles[col] = "▲", "bold"
        line = Text("".join(ruler))
        for k, style in styles.items():
            line.stylize(style, k, k + 1)
        text.append(f"{'zoomed' if self.zoom else 'marks':<{LABEL}}", "bold")
        text.append_text(line)
        text.append(f" {int(edges[0])}-{int(edges[-1]) - 1}"[:VALUE], "dim")
        return text
