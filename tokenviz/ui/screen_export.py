"""An export from a screen (x, and X for the screenshot alone): a screenshot (SVG) written here, and the
worker's part (the journey's JSON and HTML page, or a comparison's three files) under the same name.

The name is claimed before anything is written, so two exports in one second never share one; the
worker's part is asked for first, so a quit right after still finds it queued (a worker finishes its
queued writes when it stops); the screenshot waits, at most EXPORT_WAIT_S, for a view the model is
computing to draw its result rather than its note.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import ClassVar, Protocol

from textual.notifications import SeverityLevel

from tokenviz.contract.commands import Command
from tokenviz.contract.errors import TokenvizError
from tokenviz.files.atomic import free_name, write_file

EXPORT_WAIT_S = 30.0  # the most a screenshot waits for a view the model is computing
CLAIMED: set[str] = set()  # export names this process has given out (their files may not be written yet)


class Exporting(Protocol):
    """What an export needs of its screen."""

    EXPORT_NAME: ClassVar[str]  # an export's name starts with this
    EXPORT_SUFFIXES: ClassVar[tuple[str, ...]]  # what the worker writes beside the screenshot

    def exportable(self) -> bool: ...

    def export_request(self, stem: str) -> Command: ...

    def submit(self, command: Command) -> None: ...

    def computing(self) -> bool:
        """Whether a view on screen shows a note while the model computes its result."""

    def screenshot(self) -> str:
        """The screen as an SVG."""

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information") -> None: ...

    def set_timer(self, delay: float, callback: Callable[[], None]) -> object: ...


class ScreenExport:
    """A screen's exports, and the screenshot one of them holds while a view is computed."""

    def __init__(self, screen: Exporting):
        self.screen = screen
        self.held: str | None = None  # an export's name, its screenshot waiting for a view

    def export(self, with_journey: bool) -> None:
        """Name the export, ask the worker for its part (`with_journey`), then take the screenshot: now,
        or once no view computes."""
        screen = self.screen
        if with_journey and not screen.exportable():
            screen.notify("nothing to export yet", severity="warning")
            return
        stem = free_name(
            f"{screen.EXPORT_NAME}-{datetime.now():%Y%m%d-%H%M%S}", (".svg", *screen.EXPORT_SUFFIXES), taken=CLAIMED
        )
        CLAIMED.add(stem)
        if with_journey:
            screen.submit(screen.export_request(stem))
        if self.held is not None:  # an earlier one still waits: it is taken now
            self._write(self.held)
        if not screen.computing():
            self._write(stem)
            return
        self.held = stem
        screen.notify("the screenshot waits for the view being computed", title="export")
        screen.set_timer(EXPORT_WAIT_S, lambda: self.take_held(waited_for=stem))

    def take_held(self, waited_for: str | None = None) -> None:
        """The held screenshot, once no view computes; or as it is, when `waited_for` (its name) has
        waited its longest."""
        stem = self.held
        if stem is not None and (stem == waited_for or not self.screen.computing()):
            self._write(stem)

    def _write(self, stem: str) -> None:
        self.held = None
        try:
            svg_path = write_file(f"{stem}.svg", self.screen.screenshot())
        except TokenvizError as exc:
            self.screen.notify(str(exc), severity="error")
            return
        self.screen.notify(f"saved {svg_path}", title="export")
