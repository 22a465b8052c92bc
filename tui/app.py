"""The Textual app: a timeline of the run with a step cursor, and tabs that read the step under it
(decisions and queues), its block pool, the selected request's life, the run's description, and the
comparison with a second run. Only the visible tab is redrawn on a step move."""
from __future__ import annotations

from collections.abc import Callable

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Static, TabbedContent, TabPane

from tui import views
from tui.compare import CLOCK_TOLERANCE_S, Comparison
from tui.model import RunIndex
from tui.panes import BlocksPane, ComparePane, GoToStep, RequestPane, RunPane, SelectRequest, StepPane
from tui.screens import HelpScreen, PromptScreen
from tui.widgets.timeline import Series, Timeline

TABS = ("step", "blocks", "request", "run", "compare")
MIN_WIDTH, MIN_HEIGHT = 60, 14


class StepscopeApp(App):
    TITLE = "stepscope"
    CSS = """
    #title { height: 1; background: $boost; }
    #title, #step-summary, #block-legend, #block-detail {
        text-wrap: nowrap; text-overflow: ellipsis; }
    Timeline { height: 5; }
    #tabs { height: 1fr; }
    #tabs > ContentSwitcher { height: 1fr; }
    TabPane { height: 1fr; padding: 0; }
    #step-summary { height: 3; }
    #scheduled { height: 1fr; min-height: 4; }
    #queues { height: 1fr; }
    #queues > Vertical { width: 1fr; }
    #queues > #waiting-box { width: 2fr; }
    .caption { height: 1; text-style: bold; }
    #block-legend, #block-detail { height: 2; }
    #request-info { height: auto; max-height: 5; }
    #compare-head { height: auto; max-height: 3; }
    #compare-explain { height: 12; border-top: solid $accent; }
    #too-small { display: none; }
    Screen.-short Timeline { display: none; }
    Screen.-narrow #queues { layout: vertical; }
    Screen.-tiny #too-small { display: block; height: 1fr; content-align: center middle; }
    Screen.-tiny TabbedContent, Screen.-tiny Timeline, Screen.-tiny #title, Screen.-tiny Footer { display: none; }
    """
    BINDINGS = [
        Binding("n,right", "step(1)", "Next step"),
        Binding("p,left", "step(-1)", "Prev step"),
        Binding("right_square_bracket,shift+right", "step(100)", "+100 steps"),
        Binding("left_square_bracket,shift+left", "step(-100)", "-100 steps"),
        Binding("g", "goto", "Go to step"),
        Binding("x", "preemption(1)", "Next preemption"),
        Binding("X", "preemption(-1)", "Previous preemption", show=False),
        Binding("s", "select", "Select request"),
        Binding("r", "request_step(1)", "Next step of request"),
        Binding("R", "request_step(-1)", "Previous step scheduling the selected request", show=False),
        Binding("d", "divergence(1)", "Next divergence (compare)", show=False),
        Binding("D", "divergence(-1)", "Previous divergence (compare)", show=False),
        Binding("f", "first_divergence", "First divergence (compare)", show=False),
        Binding("c", "clocks_parted", "First step where the clocks parted (compare)", show=False),
        Binding("k", "pools_parted", "First step where the KV pools differed (compare)", show=False),
        Binding("b", "swap_run", "Show the other run in Step/Blocks/Request (compare)", show=False),
        Binding("z", "zoom", "Timeline: whole run / one step per column", show=False),
        Binding("1", "tab('step')", "Step tab", show=False),
        Binding("2", "tab('blocks')", "Blocks tab", show=False),
        Binding("3", "tab('request')", "Request tab", show=False),
        Binding("4", "tab('run')", "Run tab", show=False),
        Binding("5", "tab('compare')", "Compare tab", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, run_a: RunIndex, run_b: RunIndex | None = None) -> None:
        super().__init__()
        self.runs = [run_a] if run_b is None else [run_a, run_b]
        self.cmp = Comparison(run_a, run_b) if run_b is not None else None
        self.shown = 0
        self.pos = 0
        self.selected: str | None = None

    @property
    def current(self) -> RunIndex:
        return self.runs[self.shown]

    # ---- layout --------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(id="title")
        yield Timeline(id="timeline")
        with TabbedContent(initial="step", id="tabs"):
            with TabPane("1 Step", id="step"):
                yield StepPane()
            with TabPane("2 Blocks", id="blocks"):
                yield BlocksPane()
            with TabPane("3 Request", id="request"):
                yield RequestPane()
            with TabPane("4 Run", id="run"):
                yield RunPane()
            if self.cmp is not None:
                with TabPane("5 Compare", id="compare"):
                    yield ComparePane(self.cmp)
        yield Static(id="too-small")
        yield Footer()

    def on_mount(self) -> None:
        self._load_run()
        self.query_one("#scheduled").focus()
        self._fit(self.size.width, self.size.height)
        self.refresh_views()

    def _load_run(self) -> None:
        """Point the timeline at the shown run."""
        run = self.current
        marks = [(run.preempt_pos, "P", "bold red")]
        if self.cmp is not None:
            marks.append((self.cmp.divergent, "◆", "bold yellow"))
        self.query_one(Timeline).set_data([
            Series("step ms", run.duration * 1e3, "{:.2f} ms", "cyan"),
            Series("tokens", run.tokens, "{:d} tok", "green"),
            Series("KV used", run.kv_frac * 100, "{:.1f}%", "yellow", top=100.0),
            Series("waiting", run.num_waiting, "{:d} req", "magenta")], marks)
        self.pos = run.clamp(self.pos)

    def on_resize(self, event: events.Resize) -> None:
        self._fit(event.size.width, event.size.height)

    def _fit(self, width: int, height: int) -> None:
        screen = self.screen
        tiny = width < MIN_WIDTH or height < MIN_HEIGHT
        screen.set_class(tiny, "-tiny")
        screen.set_class(height < 30, "-short")
        screen.set_class(width < 110, "-narrow")
        if tiny:
            self.query_one("#too-small", Static).update(
                f"Terminal too small ({width}x{height}): stepscope needs at least {MIN_WIDTH}x{MIN_HEIGHT}. q quits.")

    # ---- redraw --------------------------------------------------------------------------------
    @property
    def active_tab(self) -> str:
        return self.query_one(TabbedContent).active

    def refresh_views(self) -> None:
        if self.active_tab != "compare":
            self.pos = self.current.clamp(self.pos)
        run, pos = self.current, self.pos
        self.query_one("#title", Static).update(views.title(run, pos, self.selected, len(self.runs)), layout=False)
        self.query_one(Timeline).set_cursor(pos)
        tab = self.active_tab
        if tab == "run":
            self.query_one(RunPane).show(self.runs)
        elif not run.n:
            return
        elif tab == "compare" and self.cmp is not None:
            self.query_one(ComparePane).show(pos)
        else:
            panes: dict[str, type[StepPane | BlocksPane | RequestPane]] = {
                "step": StepPane, "blocks": BlocksPane, "request": RequestPane}
            self.query_one(panes[tab]).show(run, pos, self.selected)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.refresh_views()

    def on_select_request(self, message: SelectRequest) -> None:
        self.select(message.request_id)

    def on_go_to_step(self, message: GoToStep) -> None:
        self.go(message.pos)

    # ---- navigation ----------------------------------------------------------------------------
    def go(self, pos: int) -> None:
        """Move the step cursor; the Compare tab reaches steps that only the longer run has."""
        last = self.cmp.n - 1 if self.cmp is not None and self.active_tab == "compare" else self.current.n - 1
        pos = max(0, min(int(pos), last))
        if pos != self.pos:
            self.pos = pos
            self.refresh_views()

    def select(self, rid: str | None) -> None:
        if rid != self.selected:
            self.selected = rid
            self.refresh_views()

    def _jump(self, target: int | None, none: str) -> None:
        if target is None:
            self.notify(none, severity="warning", timeout=3)
        else:
            self.go(target)

    def action_step(self, delta: int) -> None:
        self.go(self.pos + delta)

    def action_goto(self) -> None:
        def done(value: str | None) -> None:
            if not value:
                return
            if value in ("$", "end", "last"):
                self.go(self.current.n - 1)
            elif value.lstrip("-").isdigit():
                self.go(self.current.pos_of_step(int(value)))
            else:
                self.notify(f"not a step number: {value!r}", severity="error", timeout=3)
        self.push_screen(PromptScreen(f"Go to step (0-{int(self.current.step_no[-1]) if self.current.n else 0}, $ = last)",
                                      "step number"), done)

    def action_select(self) -> None:
        def done(value: str | None) -> None:
            if not value:
                return
            if self.current.has_request(value):
                self.select(value)
            else:
                self.notify(f"no request {value!r} in {self.current.name}", severity="error", timeout=3)
        self.push_screen(PromptScreen("Select request (id)", "request id"), done)

    def action_preemption(self, direction: int) -> None:
        run = self.current
        self._jump(run.next_in(run.preempt_pos, self.pos, direction),
                   f"no preemption {'after' if direction > 0 else 'before'} this step")

    def action_request_step(self, direction: int) -> None:
        if not self.selected or not self.current.has_request(self.selected):
            self.notify("select a request first (a table row, or s)", severity="warning", timeout=3)
            return
        positions = self.current.scheduled_positions(self.selected)
        self._jump(self.current.next_in(positions, self.pos, direction),
                   f"{self.selected} is not scheduled {'after' if direction > 0 else 'before'} this step")

    def action_divergence(self, direction: int) -> None:
        if self.cmp is None:
            self.notify("divergences need two traces: tui TRACE_A TRACE_B", severity="warning", timeout=3)
            return
        self._jump(self.cmp.next_divergence(self.pos, direction),
                   f"no divergence {'after' if direction > 0 else 'before'} this step")

    def action_first_divergence(self) -> None:
        self._jump_compare(lambda cmp: cmp.first_divergence, "the two runs never diverge")

    def action_clocks_parted(self) -> None:
        self._jump_compare(lambda cmp: cmp.clocks_parted, "the two clocks never parted by more than "
                           f"{CLOCK_TOLERANCE_S * 1e3:g} ms")

    def action_pools_parted(self) -> None:
        self._jump_compare(lambda cmp: cmp.pools_parted, "the two KV pools never differed")

    def _jump_compare(self, where: Callable[[Comparison], int | None], never: str) -> None:
        """To a step the comparison found, in the Compare tab."""
        if self.cmp is None:
            self.action_divergence(1)
            return
        target = where(self.cmp)
        if target is not None:
            self.action_tab("compare")
        self._jump(target, never)

    def action_swap_run(self) -> None:
        if len(self.runs) < 2:
            self.notify("only one run loaded", severity="warning", timeout=3)
            return
        self.shown ^= 1
        self._load_run()
        self.refresh_views()

    def action_zoom(self) -> None:
        tl = self.query_one(Timeline)
        tl.zoom = not tl.zoom
        tl.refresh()

    def action_tab(self, name: str) -> None:
        if name == "compare" and self.cmp is None:
            self.notify("the Compare tab needs two traces", severity="warning", timeout=3)
            return
        self.query_one(TabbedContent).active = name
        focus = {"step": "#scheduled", "blocks": "#blockmap", "request": "#lifecycle", "compare": "#compare-table"}
        if name in focus:
            self.query_one(focus[name]).focus()

    def action_help(self) -> None:
        self.push_screen(HelpScreen([b for b in self.BINDINGS if isinstance(b, Binding)]))
