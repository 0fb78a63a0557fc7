"""What every pane shares: drawing from a Selection, redrawing on resize, the theme's colours,
and a border with a title."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Static

from tokenviz.contract.commands import Request
from tokenviz.contract.records import ModelInfo
from tokenviz.render.columns import fitting
from tokenviz.system.paths import BUNDLED_NAME
from tokenviz.ui.colors import ThemeColors, app_colors
from tokenviz.ui.keys import key_of
from tokenviz.ui.panes.host import JourneyHost
from tokenviz.ui.selection import Selection

T = TypeVar("T")
R = TypeVar("R")

# Every pane's border: at least 3:1 against the background in each theme (WCAG's figure for a graphic that
# says where a thing is), so a projector shows where one pane ends (30% read 1.9:1 on the light theme).
PANE_BORDER = "round $foreground 55%"


class Pane(Widget):
    """A widget drawn from a Selection: it keeps the last one and redraws it on resize (the layout
    depends on the pane's size, which is only known once laid out)."""

    selection: Selection | None = None
    _title_shown: str | None = None
    _subtitle_shown: str | None = None

    def show(self, selection: Selection) -> None:
        self.selection = selection
        self.draw(selection)

    def draw(self, selection: Selection) -> None:
        raise NotImplementedError

    def on_resize(self) -> None:
        if self.selection is not None:
            self.draw(self.selection)

    @property
    def journey(self) -> JourneyHost:
        """The journey's screen, for the pane's own actions: only that screen routes keys to a pane."""
        return cast(JourneyHost, self.screen)

    @property
    def theme_colors(self) -> ThemeColors:
        """The theme's colours for the panes (chips, bars, heatmap)."""
        return app_colors(self.app)

    def set_title(self, *variants: str) -> None:
        """The border's title: the fullest of `variants` that fits the border (titles give way, not
        chopped), set only when it changes: setting it repaints the whole pane."""
        title = self._fitting(variants)
        if title != self._title_shown:
            self._title_shown = title
            self.border_title = title

    def set_subtitle(self, *variants: str) -> None:
        """The border's subtitle, chosen and set as set_title."""
        subtitle = self._fitting(variants)
        if subtitle != self._subtitle_shown:
            self._subtitle_shown = subtitle
            self.border_subtitle = subtitle

    def _fitting(self, variants: tuple[str, ...]) -> str:
        room = self.size.width - 6  # the border's corners and the spaces around the text
        return variants[0] if room <= 0 or not variants else fitting(variants, room)


class LinesPane(Pane):
    """A bordered pane drawn as Strips (Textual's Line API). `show_lines` repaints only the lines
    that changed: a step that changes two lines of the pane costs two lines downstream (Textual's
    filters, the compositor, the terminal), not the whole pane. Lines are drawn for a size and a
    theme: `redraw` makes them again when either changed since."""

    DEFAULT_CSS = (
        f"LinesPane {{ border: {PANE_BORDER}; border-title-color: $primary; border-subtitle-color: $foreground; }}"
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._strips: list[Strip] = []
        self._look: tuple[object, ...] | None = None
        self._blank: Strip | None = None  # below the last line

    def show_lines(self, lines: list[Strip]) -> None:
        old, self._strips = self._strips, lines
        look = self.look()
        if look != self._look:
            self._look, self._blank = look, None
        changed = [
            y
            for y in range(max(len(old), len(lines)))
            if y >= len(old) or y >= len(lines) or (lines[y] is not old[y] and lines[y] != old[y])
        ]
        runs: list[list[int]] = []  # [first, last] of each run of changed lines: a refresh costs as much as a line
        for y in changed:
            if runs and runs[-1][1] == y - 1:
                runs[-1][1] = y
            else:
                runs.append([y, y])
        if runs:
            width = self.size.width
            self.refresh(*(Region(0, first, width, last - first + 1) for first, last in runs))

    def forget_look(self) -> None:
        """Draw every line anew at the next frame (the theme changed: the styles under them did too)."""
        self._blank = None
        self._strips = self.redraw()
        self._look = self.look()
        self.refresh()

    def look(self) -> tuple[object, ...]:
        """What the lines depend on besides what they show: the size, the theme, colour or none."""
        return (self.size, self.app.theme, self.app.no_color)

    def redraw(self) -> list[Strip]:
        """The lines again, for a new look (a theme changed: Textual repaints everything anyway)."""
        return self._strips

    def render_line(self, y: int) -> Strip:
        if self._look is not None and self.look() != self._look:
            self._look, self._blank = self.look(), None
            self._strips = self.redraw()
        if y < len(self._strips):
            return self._strips[y]
        if self._blank is None or self._blank.cell_length != self.size.width:
            self._blank = Strip.blank(self.size.width, self.rich_style)  # rich_style is computed anew each time
        return self._blank


class ScrollPane(VerticalScroll, Pane):
    """A bordered pane that scrolls one Static body (for content longer than the pane)."""

    DEFAULT_CSS = f"""
    ScrollPane {{ border: {PANE_BORDER}; border-title-color: $primary; border-subtitle-color: $foreground; }}
    ScrollPane > .body {{ width: 100%; }}
    """
    TITLE = ""

    def compose(self) -> ComposeResult:
        yield Static(classes="body")

    def on_mount(self) -> None:
        self.border_title = self.TITLE

    @property
    def body(self) -> Static:
        return self.query_one(".body", Static)


class RowsPane(ScrollPane):
    """A ScrollPane of rows, each cut at the pane's width (a table's); a note in it wraps."""

    DEFAULT_CSS = """
    RowsPane > .body { text-wrap: nowrap; text-overflow: ellipsis; }
    RowsPane > .body.-note { text-wrap: wrap; }
    """


class BoxPane(LinesPane):
    """A bordered pane drawn from one rich Text, as a Static would draw it, but line by line (see
    LinesPane): `update` is what the pane's `draw` calls."""

    TITLE = ""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._text = Text()

    def on_mount(self) -> None:
        self.set_title(self.TITLE)

    @property
    def content(self) -> Text:
        return self._text

    def render(self) -> Text:
        """The pane's text as one renderable (as a Static's); the screen draws it by lines."""
        return self._text

    def update(self, text: Text) -> None:
        self._text = text
        self.show_lines(self.redraw())

    def redraw(self) -> list[Strip]:
        return text_strips(self._text, self.content_size.width, self.app.console, self.rich_style)


def text_strips(text: Text, width: int, console: Console, style: Style) -> list[Strip]:
    """`text` as the lines of a pane `width` cells wide: wrapped, or cut (with its overflow) where
    the text says no_wrap, on the pane's `style`."""
    if width <= 0:
        return []
    if text.no_wrap:
        lines = text.split("\n", allow_blank=True)
        for line in lines:
            line.expand_tabs()
            line.truncate(width, overflow=text.overflow or "crop")
    else:
        lines = text.wrap(console, width)
    strips = []
    for line in lines:
        base = style + console.get_style(line.style)  # under every span: rich combines it with theirs
        if line.spans:
            line.style = base
            strips.append(Strip(line.render(console), line.cell_len))
        else:  # rich renders a line without spans unstyled
            strips.append(Strip([Segment(line.plain, base)], line.cell_len))
    return strips


WAITING = "-waiting"  # the class of a view's body while the model computes it at the cursor (a screenshot waits)


def computing(selection: Selection, run: Run[Any] | None) -> bool:
    """Whether the model is computing what a view waits for: live, not while autoplay runs (it waits for
    a pause), not cancelled, not refused."""
    s = selection.snapshot
    if not s.live or s.playing:
        return False
    return run is None or (run.kind.__name__ not in s.cancelled and run.kind.__name__ not in dict(s.failed))


def result_or_note(
    result: T | None, selection: Selection, body: Static, waiting: str, what: str, run: Run[Any] | None = None
) -> T | None:
    """A view computed at the cursor's position: `result`; or, while there is none, a note in
    `body` saying why (waiting for it, autoplay running, cancelled or refused, or a recording without it)."""
    body.set_class(result is None, "-note")  # a note wraps; a table does not
    if result is None:
        if selection.snapshot.playing:
            waiting = "this view is computed when autoplay pauses"
        body.update(pending_note(selection, waiting, what, run))
    body.set_class(result is None and computing(selection, run), WAITING)
    return result


@dataclass(frozen=True)
class Run(Generic[R]):
    """What computes a view: its kind of request, and the action of the key that runs it again."""

    kind: type[Request[R]]
    action: str


def asked_result(selection: Selection, run: Run[R], body: Static, waiting: str, what: str) -> R | None:
    """The result of a request a key runs (`run`: a beam search, speculation); while there is none,
    `body` says why (see pending_note)."""
    result = selection.snapshot.result(run.kind)
    if result is None:
        body.update(pending_note(selection, waiting, what, run))
    return result


def live_command(info: ModelInfo) -> str:
    """The command that opens a recording's model live, as its backend wrote it; a file saved before
    backends wrote it: the bundled model's by no --model at all (its name is a description), another by
    its name."""
    if info.reopen:
        return info.reopen
    return "tokenviz" if info.name == BUNDLED_NAME else f"tokenviz --model {shlex.quote(info.name)}"


def pending_note(selection: Selection, waiting: str, what: str, run: Run[Any] | None = None) -> Text:
    """What a model-computed view says before its result arrives: waiting, with the job's progress
    while it runs; cancelled, and how to run it again; refused, and why; or, in a recording (no model),
    what it lacks."""
    s = selection.snapshot
    if not s.live:
        return Text(
            f"a recording has no {what}: it needs the model. Run the journey's prompt live with "
            f"{live_command(selection.info)} (replay --verify only checks the recorded numbers)",
            style="dim",
        )
    if run is not None and run.kind.__name__ in s.cancelled:
        return Text(f"{what}: cancelled (Escape). Press {key_of(run.action)} to run it again.", style="dim")
    refused = dict(s.failed).get(run.kind.__name__) if run is not None else None
    if refused is not None:
        return Text(f"{what}: {refused}", style="dim")
    if s.message and s.progress is not None:  # a job is running: how far it is
        return Text(f"{waiting}\n{s.message}", style="dim")
    return Text(waiting, style="dim")
