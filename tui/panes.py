"""The contents of the app's tabs. Each pane redraws itself for a (run, step, selected request) in
`show`, and tells the app what the user picked with a SelectRequest or GoToStep message."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Label, Static

from traces.blocks import BlockInfo, PoolState
from tui import reasons, views
from tui.compare import Comparison
from tui.model import LifecycleEvent, RunIndex
from tui.widgets.blockmap import CACHED, FREE, HELD, LEGEND, MINE, SHARED, BlockMap, cell_codes
from tui.widgets.vtable import VTable


class SelectRequest(Message):
    def __init__(self, request_id: str) -> None:
        super().__init__()
        self.request_id = request_id


class GoToStep(Message):
    """Move the step cursor to position `pos` of the shown run."""

    def __init__(self, pos: int) -> None:
        super().__init__()
        self.pos = pos


class StepPane(Vertical):
    """The step's decisions, its counters and times, and the queues after it."""

    def compose(self) -> ComposeResult:
        yield Static(id="step-summary")
        yield VTable(views.SCHEDULED_COLUMNS, empty="(nothing scheduled in this step)", id="scheduled")
        with Horizontal(id="queues"):
            with Vertical():
                yield Label("Running (last: next FCFS victim)", classes="caption")
                yield VTable(views.RUNNING_COLUMNS, id="running")
            with Vertical(id="waiting-box"):  # wider: each row says why the step did not admit it
                yield Label("Waiting after the step (front first)", classes="caption")
                yield VTable(views.WAITING_COLUMNS, wrap=True, id="waiting")

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.row_ids: dict[str, list[str]] = {}

    def show(self, run: RunIndex, pos: int, selected: str | None) -> None:
        summary = self.query_one("#step-summary", Static)
        summary.styles.height = 4 if run.has_moe else 3  # the MoE routing line
        summary.update(views.step_summary(run, pos), layout=False)
        rows, styles, ids = views.scheduled_rows(run, pos, selected)
        self.row_ids["scheduled"] = ids
        cursor = ids.index(selected) if selected in ids else 0
        self.query_one("#scheduled", VTable).set_rows(rows, styles, cursor=cursor)
        for name, build in (("running", views.running_rows), ("waiting", views.waiting_rows)):
            count, row, ids = build(run, pos, selected)
            self.row_ids[name] = ids
            table = self.query_one(f"#{name}", VTable)
            cursor = ids.index(selected) if selected in ids else min(table.cursor, count - 1)
            table.set_source(count, row, cursor=cursor)

    def on_vtable_highlighted(self, event: VTable.Highlighted) -> None:
        ids = self.row_ids.get(event.table.id or "", [])
        event.stop()
        if event.index < len(ids):
            self.post_message(SelectRequest(ids[event.index]))


class BlocksPane(Vertical):
    """The block pool after the step; the cursor block's details below the map."""

    def compose(self) -> ComposeResult:
        yield Static(id="block-legend")
        yield BlockMap(id="blockmap")
        yield Static(id="block-detail")

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.pool: PoolState | None = None

    def show(self, run: RunIndex, pos: int, selected: str | None) -> None:
        self.pool = pool = run.blocks_at(pos)
        codes = cell_codes(pool, selected)
        bm = self.query_one(BlockMap)
        bm.set_codes(codes)
        base = codes & ~MINE
        counts = [(base == HELD).sum(), (base == SHARED).sum(), (base == CACHED).sum(), (base == FREE).sum(),
                  ((codes & MINE) > 0).sum()]
        legend = Text()
        for (glyph, colour, label), n in zip(LEGEND, counts):
            legend.append(f"{glyph} ", colour).append(f"{label} {n}   ")
        legend.append(f"\n{pool.num_blocks} blocks, one cell each; block id = position + 1", "dim")
        self.query_one("#block-legend", Static).update(legend, layout=False)
        self.show_detail(bm.cursor)

    def _block(self, index: int) -> BlockInfo | None:
        """The block at map position `index` (block id index + 1), if there is one."""
        if self.pool is None or not 0 <= index < self.pool.num_blocks:
            return None
        return self.pool.block(index + 1)

    def show_detail(self, index: int) -> None:
        t = Text()
        if (b := self._block(index)) is not None:
            t.append(f"block {b.block_id}", "bold").append(f" · {b.state}{' (shared)' if b.ref_cnt > 1 else ''}"
                                                           f" · ref_cnt {b.ref_cnt} · hash {b.hash or '-'}\n")
            t.append(f"holders: {', '.join(b.holders) or '-'}" + ("  (enter: select)" if b.holders else ""))
        self.query_one("#block-detail", Static).update(t, layout=False)

    def on_block_map_moved(self, event: BlockMap.Moved) -> None:
        self.show_detail(event.index)

    def on_block_map_picked(self, event: BlockMap.Picked) -> None:
        if (b := self._block(event.index)) is not None and b.holders:
            self.post_message(SelectRequest(b.holders[0]))


class RequestPane(Vertical):
    """The selected request's facts, latencies and lifecycle; a lifecycle row jumps to its step."""

    def compose(self) -> ComposeResult:
        yield Static(id="request-info")
        yield VTable(views.LIFECYCLE_COLUMNS, empty="(no request selected)", wrap=True, id="lifecycle")

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.key: tuple[int, str | None] = (-1, None)
        self.events: list[LifecycleEvent] = []
        self.run: RunIndex | None = None

    def show(self, run: RunIndex, pos: int, selected: str | None) -> None:
        self.run = run
        self.query_one("#request-info", Static).update(views.request_info(run, selected), layout=False)
        if self.key != (id(run), selected):
            self.key = (id(run), selected)
            known = selected is not None and run.has_request(selected)
            self.events = reasons.explained_lifecycle(run, selected) if selected is not None and known else []
        rows = [[f"{e.time:.4f}", str(e.step) if e.step >= 0 else "", e.kind, e.detail] for e in self.events]
        styles = [views.EVENT_STYLE.get(e.kind, "") for e in self.events]
        step = int(run.step_no[pos])
        at = [k for k, e in enumerate(self.events) if 0 <= e.step <= step]
        self.query_one("#lifecycle", VTable).set_rows(rows, styles, cursor=at[-1] if at else 0)

    def on_vtable_highlighted(self, event: VTable.Highlighted) -> None:
        event.stop()
        if self.run is not None and event.index < len(self.events) and self.events[event.index].step >= 0:
            self.post_message(GoToStep(self.run.pos_of_step(self.events[event.index].step)))


class RunPane(VerticalScroll):
    """Each run's description; built on first view (the headline metrics scan every request)."""

    def compose(self) -> ComposeResult:
        yield Static(id="run-info")

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.done = False

    def show(self, runs: list[RunIndex]) -> None:
        if self.done:
            return
        self.done = True
        info = Text()
        for k, r in enumerate(runs):
            info.append_text(views.run_info(r))
            info.append("\n" if k + 1 < len(runs) else "")
        self.query_one("#run-info", Static).update(info)


class ComparePane(Vertical):
    """Both runs step by step, divergent steps marked, and what differs at the cursor's step."""

    def __init__(self, cmp: Comparison, **kw) -> None:
        super().__init__(**kw)
        self.cmp = cmp

    def compose(self) -> ComposeResult:
        yield Static(views.compare_head(self.cmp), id="compare-head")
        yield VTable(views.COMPARE_COLUMNS, id="compare-table")
        yield Static(id="compare-explain")

    def on_mount(self) -> None:
        cmp = self.cmp
        self.query_one("#compare-table", VTable).set_source(
            cmp.n, lambda i: views.compare_row(cmp, i), lambda i: "red" if cmp.is_divergent[i] else "")

    def show(self, pos: int) -> None:
        self.query_one("#compare-table", VTable).move_cursor(pos, notify=False)
        self.query_one("#compare-explain", Static).update(views.explanation(self.cmp, pos), layout=False)

    def on_vtable_highlighted(self, event: VTable.Highlighted) -> None:
        event.stop()
        self.post_message(GoToStep(event.index))
