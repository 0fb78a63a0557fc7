"""What the user is looking at: the snapshot plus the view choices (layer, head, cursor)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from tokenviz.bridge import Snapshot
from tokenviz.records import StepRecord


@dataclass(frozen=True)
class View:
    snapshot: Snapshot
    layer: int  # 0-based
    head: int | str  # an index, "mean" or "max"
    cursor: int  # the selected token position

    @property
    def positions(self) -> int:
        """Positions that went through the model (and so have an attention row)."""
        s = self.snapshot
        return s.prompt_len + len(s.records) - 1 if s.records else 0

    @property
    def record(self) -> StepRecord | None:
        """The prediction made at the cursor's position, if the model computed one there."""
        index = self.cursor - self.snapshot.prompt_len + 1
        records = self.snapshot.records
        return records[index] if 0 <= index < len(records) else None

    @property
    def is_pending(self) -> bool:
        return self.record is not None and self.record is self.snapshot.pending


class Pane:
    """Mixin for panes drawn from a View: keeps the last one and redraws it on resize
    (the layout depends on the pane's size, which is only known once laid out)."""

    view: "View | None" = None

    def show(self, view: "View") -> None:
        self.view = view
        self.draw(view)

    def draw(self, view: "View") -> None:
        raise NotImplementedError

    def on_resize(self) -> None:
        if self.view is not None:
            self.draw(self.view)


class ScrollPane(Pane, VerticalScroll):
    """A bordered pane that scrolls one Static body (for content longer than the pane)."""

    DEFAULT_CSS = """
    ScrollPane { border: round $foreground 30%; border-title-color: $primary; }
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

    DEFAULT_CSS = "BoxPane { border: round $foreground 30%; border-title-color: $primary; }"
    TITLE = ""

    def on_mount(self) -> None:
        self.border_title = self.TITLE


def pending_note(view: View, waiting: str, what: str) -> Text:
    """What a model-computed view says before its result arrives, or in a recording (no model)."""
    if not view.snapshot.live:
        return Text(f"a recorded journey carries no {what}: this view needs the model "
                    "(tokenviz replay FILE --verify re-runs it)", style="dim")
    return Text(waiting, style="dim")


def theme_var(app, name: str, default: str) -> str:
    return app.current_theme.variables.get(name, default) if app.current_theme else default
