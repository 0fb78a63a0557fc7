"""What every pane shares: drawing from a Selection, redrawing on resize, the theme's colours,
and a border with a title."""

from __future__ import annotations

from typing import Any, TypeVar

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from tokenviz.ui.colors import ThemeColors, theme_colors
from tokenviz.ui.selection import Selection

T = TypeVar("T")


class Pane:
    """Mixin for panes drawn from a Selection: keeps the last one and redraws it on resize
    (the layout depends on the pane's size, which is only known once laid out)."""

    selection: Selection | None = None
    app: Any  # the Textual app (every widget has one)

    def show(self, selection: Selection) -> None:
        self.selection = selection
        self.draw(selection)

    def draw(self, selection: Selection) -> None:
        raise NotImplementedError

    def on_resize(self) -> None:
        if self.selection is not None:
            self.draw(self.selection)

    @property
    def colors(self) -> ThemeColors:
        return theme_colors(self.app.current_theme)


class ScrollPane(Pane, VerticalScroll):
    """A bordered pane that scrolls one Static body (for content longer than the pane)."""

    DEFAULT_CSS = """
    ScrollPane { border: round $foreground 30%; border-title-color: $primary; border-subtitle-color: $foreground; }
    ScrollPane > .body { width: 100%; }
    """
    TITLE = ""

    def compose(self):
        yield Static(classes="body")

    def on_mount(self) -> None:
        self.border_title = self.TITLE

    @property
    def body(self) -> Static:
        return self.query_one(".body", Static)


class BoxPane(Pane, Static):
    """A bordered pane that is itself one Static."""

    DEFAULT_CSS = (
        "BoxPane { border: round $foreground 30%; border-title-color: $primary; border-subtitle-color: $foreground; }"
    )
    TITLE = ""

    def on_mount(self) -> None:
        self.border_title = self.TITLE


def result_or_note(result: T | None, selection: Selection, body: Static, waiting: str, what: str) -> T | None:
    """A view computed at the cursor's position: `result`; or, while there is none, a note in
    `body` saying why (waiting for it, autoplay running, or a recording without it)."""
    body.set_class(result is None, "-note")  # a note wraps; a table does not
    if result is None:
        if selection.snapshot.playing:
            waiting = "this view is computed when autoplay pauses"
        body.update(pending_note(selection, waiting, what))
    return result


def pending_note(selection: Selection, waiting: str, what: str) -> Text:
    """What a model-computed view says before its result arrives, or in a recording (no model)."""
    if not selection.snapshot.live:
        return Text(
            f"a recorded journey carries no {what}: this view needs the model "
            "(tokenviz replay FILE --verify re-runs it)",
            style="dim",
        )
    return Text(waiting, style="dim")
