"""Modal screens: the key help (built from the bindings, so it lists every key) and a one-line prompt."""
from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

WIDGET_KEYS = [
    ("up / down, enter", "tables: move the row cursor / choose the row (a request row selects the request,"
                         " a lifecycle or compare row jumps to its step)"),
    ("pageup / pagedown, home / end", "tables: page, first / last row"),
    ("click", "tables and block map: select the row / block under the mouse"),
    ("arrows, pageup / pagedown", "block map (focused): move the block cursor"),
    ("enter", "block map: select the block's (first) holder as the request"),
    ("tab / shift+tab", "move the focus between tables and the block map"),
]


def help_text(bindings: list[Binding], display: Callable[[Binding], str]) -> Text:
    """Every binding's keys (as `display` shows them) and description, then the widgets' own keys."""
    rows = [(" / ".join(display(Binding(k.strip(), b.action)) for k in b.key.split(",")), b.description)
            for b in bindings]
    width = max(len(keys) for keys, _ in rows + WIDGET_KEYS) + 3
    t = Text()
    t.append("stepscope tui: keys\n\n", "bold underline")
    for keys, what in rows:
        t.append(f"  {keys:<{width}}", "bold cyan")
        t.append(f"{what}\n")
    t.append("\nIn tables and the block map\n\n", "bold underline")
    for keys, what in WIDGET_KEYS:
        t.append(f"  {keys:<{width}}", "bold cyan")
        t.append(f"{what}\n")
    t.append("\nThe running and waiting queues are rebuilt from each step's decisions (arrivals, admissions, "
             "preemptions, finishes). Escape, q or ? closes this.", "dim")
    return t


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; max-width: 100; height: 90%; border: round $accent;
                                  background: $surface; padding: 0 1; }
    """

    def __init__(self, bindings: list[Binding]) -> None:
        super().__init__()
        self.bindings = bindings

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(help_text(self.bindings, self.app.get_key_display), id="help-text")


class PromptScreen(ModalScreen[str | None]):
    """Asks for one value (a step number, a request id); escape cancels with None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    PromptScreen { align: center middle; }
    PromptScreen > Vertical { width: 60; max-width: 95%; height: auto; border: round $accent;
                              background: $surface; padding: 0 1; }
    """

    def __init__(self, question: str, placeholder: str = "") -> None:
        super().__init__()
        self.question, self.placeholder = question, placeholder

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question)
            yield Input(placeholder=self.placeholder, id="prompt-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
