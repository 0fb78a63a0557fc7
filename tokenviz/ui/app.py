"""The Textual app: one app for a journey and for a comparison. It registers the themes, draws
without colour under NO_COLOR, opens the screen for the worker it is given (the journey's, or a
comparison's with `comparing`), and quits cleanly on q, ctrl+c, SIGTERM or SIGHUP.

It never touches torch: the workers (built by the CLI) own the model in their own threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Sequence
from typing import ClassVar

from textual import events, on
from textual.app import App
from textual.command import CommandPalette
from textual.filter import LineFilter
from textual.screen import Screen

from tokenviz.contract.snapshot import ComparisonSnapshot, Snapshot
from tokenviz.contract.worker import Worker
from tokenviz.ui.command_palette import ThemePicker, TokenvizCommands
from tokenviz.ui.compare_screen import CompareScreen
from tokenviz.ui.journey_screen import JourneyScreen
from tokenviz.ui.panes.base import LinesPane
from tokenviz.ui.themes import DEFAULT_THEME, load_themes
from tokenviz.ui.truecolor import SkipTruecolor, skipping
from tokenviz.ui.worker_screen import WorkerScreen, WorkerStarted

QUIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)  # quit as q does: the terminal is left sane
QUIT_GRACE_S = 3.0  # after one of them, the longest the process lives on (more while a write is asked for)
WRITE_WAIT_S = 60.0  # the longest quitting waits for the writes asked for (export, save)


class TokenvizApp(App[None]):
    TITLE = "tokenviz"
    CSS_PATH = "app.tcss"
    COMMANDS: ClassVar = {TokenvizCommands}  # the only provider: see command_palette

    def __init__(
        self,
        worker: Worker[Snapshot] | Worker[ComparisonSnapshot],
        theme: str = DEFAULT_THEME,
        comparing: bool = False,
    ):
        # NO_COLOR: Textual alone would draw in greys; native ANSI makes it drop colour altogether.
        super().__init__(ansi_color=True if "NO_COLOR" in os.environ else None)
        self.first: WorkerScreen[Snapshot] | WorkerScreen[ComparisonSnapshot] = (
            CompareScreen(worker) if comparing else JourneyScreen(worker)  # type: ignore[arg-type]
        )
        self.started: list[Worker[Snapshot] | Worker[ComparisonSnapshot]] = []  # every screen's worker
        self.signalled: int | None = None  # the signal that ended the app (the process exits 128 + it)
        self.ending = False  # quit asked for (q, ctrl+c, a signal): input is no longer acted on
        self._truecolor: dict[int, SkipTruecolor] = {}
        for t in load_themes().values():
            self.register_theme(t)
        self.theme = theme

    @property
    def fatal_error(self) -> str | None:
        """Why the first screen's worker could not load (the command line prints it, exit 2)."""
        return self.first.fatal_error

    @property
    def journey(self) -> JourneyScreen:
        """The journey's screen (the app's first)."""
        assert isinstance(self.first, JourneyScreen)
        return self.first

    def get_default_screen(self) -> Screen[None]:
        return self.first

    def get_line_filters(self) -> Sequence[LineFilter]:
        return skipping(list(super().get_line_filters()), self._truecolor)

    def on_mount(self) -> None:
        if not self.is_headless:  # a real terminal: leave it sane when the process is told to end
            loop = asyncio.get_running_loop()
            for signum in QUIT_SIGNALS:
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(signum, self._signalled, signum)

    @on(WorkerStarted)
    def _keep_worker(self, message: WorkerStarted) -> None:
        self.started.append(message.worker)

    def _signalled(self, signum: int) -> None:
        """SIGTERM, SIGHUP (the terminal closed) or SIGINT: quit as q does, restoring the terminal;
        the process then exits 128 + the signal. Should the shutdown hang (Textual's writer to a
        terminal that is gone can wait forever, seen while the engine thread imported torch), the
        process ends anyway after QUIT_GRACE_S, or once the writes asked for are done."""
        self.signalled = signum
        writing = any(worker.writes_pending for worker in self.started)
        ending = threading.Timer(QUIT_GRACE_S + (WRITE_WAIT_S if writing else 0), os._exit, args=(128 + signum,))
        ending.daemon = True
        ending.start()
        self._stop_workers(timeout=0.2)
        self._end()

    def _end(self) -> None:
        self.ending = True
        self.exit()

    async def on_event(self, event: events.Event) -> None:
        """Once the app is ending, what is typed after q acts no more: `q` then `e` typed at once had
        opened the prompt editor on an app already taking its widgets down (a traceback, exit 1)."""
        if self.ending and isinstance(event, events.InputEvent):
            return
        await super().on_event(event)

    def _stop_workers(self, timeout: float) -> None:
        for worker in self.started:
            worker.stop(timeout=timeout)

    def finish(self, quit_wait_s: float) -> list[str]:
        """After the app has ended: stop every worker, waiting up to WRITE_WAIT_S for the writes the
        user asked for (each worker finishes its queued Saves), else `quit_wait_s`; what they could
        not write, one line each."""
        for worker in self.started:
            worker.stop(timeout=quit_wait_s)
            if worker.writes_pending:
                worker.stop(timeout=WRITE_WAIT_S)
        return [failure for worker in self.started for failure in worker.write_failures]

    def search_themes(self) -> None:
        """The theme picker, tokenviz's own themes first."""
        self.push_screen(CommandPalette(providers=[ThemePicker], placeholder="Search for themes…"))

    def watch_theme(self) -> None:
        """Every pane drawn again in the new theme, once Textual has restyled for it: a line kept
        from before (the panes keep their lines between frames) would keep the old colours."""
        self.call_after_refresh(self._repaint_all)

    def _repaint_all(self) -> None:
        for screen in self.screen_stack:
            if isinstance(screen, WorkerScreen):
                for pane in screen.query(LinesPane):
                    pane.forget_look()
                screen.refresh_panes()
                screen.refresh(layout=False)

    async def action_quit(self) -> None:
        self._stop_workers(timeout=0)  # ask them to stop; the command line ends the process (cli.exit_now)
        self._end()
