"""What every screen that shows a worker's journey shares: it starts its worker, receives its
snapshots, paces the frames during autoplay, shows errors and notices, quits, helps and exports (an
export's work is ui/screen_export's).

The journey's screen and the comparison's are two uses of it; each says how to draw a snapshot.
"""

from __future__ import annotations

import time
from typing import ClassVar, Generic, TypeVar, cast

from textual import events, on
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Static

from tokenviz.contract.commands import Command, Move, Pace, Play, Reset, Rewind, Step
from tokenviz.contract.snapshot import CANCELS, ComparisonSnapshot, Snapshot
from tokenviz.contract.worker import Worker
from tokenviz.ui.keys import KeyRow, PaletteCommand
from tokenviz.ui.panes.base import WAITING
from tokenviz.ui.panes.status import StatusLine
from tokenviz.ui.screen_export import ScreenExport
from tokenviz.ui.screens import HelpScreen

S = TypeVar("S", Snapshot, ComparisonSnapshot)

# During autoplay, the most of the time drawing frames may take. A frame costs the model about twice its
# own time on a machine with few cores (the engine waits for the interpreter, and computes the rows it
# shows): on this project's 2-core machine at 200x60, 5% slowed autoplay by 9-13%, 2.5% by about 5%.
UI_SHARE = 0.025
MAX_FRAME_GAP_S = 1.0  # autoplay's frames at least this often, however costly one is (a busy machine)
MIN_SIZE = (64, 20)  # columns, rows: below it the panes cannot show their numbers, and one line says so


class WorkerStarted(Message):
    """A screen started its worker: the app keeps it, to stop it and wait for its writes at the end."""

    def __init__(self, worker: Worker[Snapshot] | Worker[ComparisonSnapshot]):
        super().__init__()
        self.worker = worker


class WorkerUpdate(Message):
    """A snapshot from the worker (posted from its thread), whole: built once there, never copied."""

    def __init__(self, snapshot: Snapshot | ComparisonSnapshot):
        super().__init__()
        self.snapshot = snapshot


class TooSmall(Static):
    """Shown instead of the panes when the terminal is below MIN_SIZE."""

    SCOPED_CSS = False  # its rules hide the screen's other widgets
    DEFAULT_CSS = """
    TooSmall { display: none; width: 100%; height: 100%; content-align: center middle; text-style: bold; }
    WorkerScreen.-too-small > * { display: none; }
    WorkerScreen.-too-small > TooSmall { display: block; }
    """


class WorkerScreen(Screen[None], Generic[S]):
    """A screen that shows one worker's journey (or journeys): see the module's docstring."""

    KEY_ROWS: ClassVar[tuple[KeyRow, ...]]  # this screen's key table (bindings, palette, help)
    PALETTE_ONLY: ClassVar[tuple[PaletteCommand, ...]]  # (label, action[, owner]) of the palette's other commands
    ACTION_OWNERS: ClassVar[dict[str, str]] = {}  # the panes that own actions, by name (see keys.routed)
    HELP: ClassVar[str]  # the help screen's text
    EXPORT_NAME: ClassVar[str]  # an export's name starts with this
    EXPORT_SUFFIXES: ClassVar[tuple[str, ...]]  # what an export writes beside the screenshot

    cursor: reactive[int | None] = reactive(None, init=False)  # the token position chosen; None: the newest

    def __init__(self, worker: Worker[S]):
        super().__init__()
        self.worker: Worker[S] = worker
        self.snapshot: S | None = None  # the newest from the worker
        self.snapshot_drawn: S | None = None  # the one on screen
        self.fatal_error: str | None = None  # the worker could not load: the command line prints it, exit 2
        self._repaint_scheduled = False
        self._frame_cost = 0.0  # seconds to draw a frame (a moving average), see _frame_delay
        self._play_went_on = False  # the frame drawn continues an autoplay drawn before it (no key between)
        self._frame_started = 0.0
        self._frame_timer: Timer | None = None
        self._exports = ScreenExport(self)

    def on_mount(self) -> None:
        def post(snapshot: Snapshot | ComparisonSnapshot) -> None:
            self.post_message(WorkerUpdate(snapshot))  # thread-safe; the snapshot handed over whole, never copied

        self.worker.start(post)
        self.post_message(WorkerStarted(self.worker))
        self.mount(TooSmall())
        self._check_size(self.size)

    def on_resize(self, event: events.Resize) -> None:
        self._check_size(event.size)

    def _check_size(self, size: Size) -> None:
        """Below MIN_SIZE the panes give way to one line: how big the terminal must be."""
        small = size.width < MIN_SIZE[0] or size.height < MIN_SIZE[1]
        self.set_class(small, "-too-small")
        if small and self.query(TooSmall):
            self.query_one(TooSmall).update(
                f"tokenviz needs at least {MIN_SIZE[0]}×{MIN_SIZE[1]} (this is {size.width}×{size.height}):\n"
                "a larger terminal, or a smaller font"
            )

    def on_unmount(self) -> None:
        self.worker.stop(timeout=0.5)

    def submit(self, command: Command) -> None:
        """Send `command` to the worker. A move made while a long job runs waits for it: said at once."""
        s = self.snapshot
        if isinstance(command, Move):
            if self.model_loading:
                self.notify("queued: it runs once the model is ready")
            elif s is not None and CANCELS in (s.message or ""):
                self.notify("queued: it runs when the job now running ends (Escape cancels the job)")
        self.worker.submit(command)

    @property
    def model_loading(self) -> bool:
        """Whether the worker is still loading (one call that cannot stop part way, except a compile)."""
        return self.snapshot is None or self.snapshot.state == "loading"

    # ---- what a screen gives -------------------------------------------------------------------------

    def draw(self, before: S | None, snapshot: S) -> None:
        """Show `snapshot` (the one on screen before it was `before`)."""
        raise NotImplementedError

    def refresh_panes(self) -> None:
        """Draw the newest snapshot again (the theme or a choice of what to show changed)."""
        raise NotImplementedError

    def exportable(self) -> bool:
        """Whether there is a journey to export yet."""
        raise NotImplementedError

    def export_request(self, stem: str) -> Command:
        """What the worker writes for an export named `stem` (the screenshot is written here)."""
        raise NotImplementedError

    # ---- snapshots, paced -----------------------------------------------------------------------------

    @on(WorkerUpdate)
    def _received(self, message: WorkerUpdate) -> None:
        s = cast(S, message.snapshot)  # its worker posts its own kind
        self.snapshot = s
        if s.error:
            self.notify(s.error, severity="error", timeout=6)
        if s.notice:
            self.notify(s.notice)
        # Snapshots queued behind this one make it stale: repaint once, after the queue drains.
        delay = self._frame_delay(s)
        if self._frame_timer is not None and delay == 0:  # autoplay ended: draw now, not at the next tick
            self._frame_timer.stop()
            self._frame_timer, self._repaint_scheduled = None, False
        if not self._repaint_scheduled:
            self._repaint_scheduled = True
            if delay > 0:
                self._frame_timer = self.set_timer(delay, self._apply_snapshot)
            else:
                self.call_later(self._apply_snapshot)

    def _frame_delay(self, s: S) -> float:
        """While autoplay runs, frames are spaced so drawing takes at most UI_SHARE of the time: on a
        machine with few cores every frame drawn is time the model does not get. A frame that answers
        a key (a setting changed) is drawn at once: a person waits for it."""
        drawn = self.snapshot_drawn
        if not s.playing or s.pace_s or drawn is None or not drawn.playing:  # a set pace: the engine waits
            return 0.0  # autoplay starting or ending is shown at once
        if s.handled != drawn.handled or not self._play_went_on:  # autoplay's first step answers the key
            return 0.0
        return max(self._frame_gap - (time.perf_counter() - self._frame_started), 0.0)

    @property
    def _frame_gap(self) -> float:
        """The time between autoplay's frames: drawing at most UI_SHARE of it, and never a second past."""
        return min(self._frame_cost / UI_SHARE, MAX_FRAME_GAP_S)

    def _measure_frame(self, seconds: float) -> None:
        """A frame's whole cost, once the screen is composed (a moving average)."""
        self._frame_cost = 0.7 * self._frame_cost + 0.3 * seconds
        self.worker.space_frames(self._frame_gap)

    def _apply_snapshot(self) -> None:
        self._repaint_scheduled, self._frame_timer = False, None
        before, s = self.snapshot_drawn, self.snapshot
        self.snapshot_drawn = s
        if s is None:
            return
        self._play_went_on = before is not None and before.playing and s.playing and before.handled == s.handled
        started = self._frame_started = time.perf_counter()
        self.call_after_refresh(lambda: self._measure_frame(time.perf_counter() - started))
        self.draw(before, s)
        if self._exports.held is not None:
            self.call_after_refresh(self._exports.take_held)

    # ---- keys every screen has ---------------------------------------------------------------------------

    def _moving(self, command: Command) -> None:
        """`command`, which moves the journey: the selection follows its newest step."""
        self.cursor = None
        self.submit(command)

    def action_step(self) -> None:
        self._moving(Step())

    def action_autoplay(self) -> None:
        self._moving(Play())

    def action_rewind(self) -> None:
        self._moving(Rewind())

    def action_reset(self) -> None:
        self._moving(Reset())

    def action_pace(self, delta: int) -> None:
        self.submit(Pace(delta=delta))

    def action_cancel(self) -> None:
        self.worker.cancel()
        if self.model_loading and CANCELS not in (self.snapshot.message if self.snapshot else ""):
            self.notify("loading cannot stop part way: q quits")
        for line in self.query(StatusLine):  # acknowledged at once: the job stops at its next chunk
            line.cancelling()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(self.HELP))

    async def action_quit(self) -> None:
        await self.app.action_quit()

    def action_export_svg(self) -> None:
        self._exports.export(with_journey=False)

    def action_export(self) -> None:
        self._exports.export(with_journey=True)

    # ---- what an export asks of the screen (ui/screen_export.Exporting) ---------------------------------

    def computing(self) -> bool:
        return any(widget.region.area for widget in self.query(f".{WAITING}"))

    def screenshot(self) -> str:
        return self.app.export_screenshot()
