"""The Textual app: it composes the panes, routes keys to commands and repaints from Snapshots.

It never touches torch: the worker it is given (built by the CLI) owns the model in its own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from typing import ClassVar

from textual import events, on, work
from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.filter import LineFilter
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.timer import Timer
from textual.widgets import ContentSwitcher, Footer, ProgressBar

from tokenviz.contract.attention import HEAD_MODES, Head
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.results import AttributionMethod
from tokenviz.contract.snapshot import Snapshot
from tokenviz.files.atomic import free_name, write_file
from tokenviz.ui.colors import page_colors
from tokenviz.ui.command_palette import TokenvizCommands
from tokenviz.ui.keys import bindings, model_actions
from tokenviz.ui.panes.attention import AttentionPane
from tokenviz.ui.panes.attribution import AttributionPane, current_attribution
from tokenviz.ui.panes.base import Pane, ScrollPane
from tokenviz.ui.panes.beams import BeamPane
from tokenviz.ui.panes.branches import BranchPane
from tokenviz.ui.panes.cache import CachePane
from tokenviz.ui.panes.charts import ChartsPane
from tokenviz.ui.panes.embedding import EmbeddingPane
from tokenviz.ui.panes.lens import LensPane, current_inspection
from tokenviz.ui.panes.model import ModelPane
from tokenviz.ui.panes.next_token import NextTokenPane
from tokenviz.ui.panes.sampling import SamplingPane
from tokenviz.ui.panes.speculation import SpeculationPane
from tokenviz.ui.panes.status import StatusLine
from tokenviz.ui.panes.timing import TimingPane
from tokenviz.ui.panes.tokens import TokensPane
from tokenviz.ui.panes.watch import WatchPane, current_difference
from tokenviz.ui.screens import ContinueScreen, HelpScreen, PromptChoice, PromptScreen, WatchScreen
from tokenviz.ui.selection import Selection
from tokenviz.ui.themes import DEFAULT_THEME, load_themes
from tokenviz.ui.truecolor import SkipTruecolor, skipping
from tokenviz.worker.commands import (
    Adjust,
    Attribute,
    Beams,
    BranchAt,
    Command,
    Continue,
    Force,
    Inspect,
    Pace,
    Play,
    Reset,
    Rewind,
    Save,
    ShowAttention,
    Speculate,
    SplitDifference,
    Start,
    Step,
    SwitchBranch,
    Verify,
    Watch,
    Worker,
)

# The views that can take the attention pane's place, by widget id. A view's key pressed again
# returns to attention.
VIEWS = {
    "lens": LensPane,
    "attribution": AttributionPane,
    "embedding": EmbeddingPane,
    "cache": CachePane,
    "timing": TimingPane,
    "beams": BeamPane,
    "branches": BranchPane,
    "speculation": SpeculationPane,
    "model": ModelPane,
    "watch": WatchPane,
    "charts": ChartsPane,
}
INSPECTING_VIEWS = ("lens", "embedding")  # they ask the engine to look inside the cursor's position
BEAM_WIDTH = 3  # the B key's width; the palette offers 2-8
BEAM_STEPS = 10
SPECULATION_STEPS = 16
EXPORT_LOCK = threading.Lock()  # two quick exports pick their names one after the other
UI_SHARE = 0.05  # during autoplay, the most of the time drawing frames may take
MODEL_ACTIONS = model_actions()  # their keys are off in a recording
QUIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # quit as q does: the terminal is left sane
QUIT_GRACE_S = 3.0  # after one of them, the longest the process lives on


class EngineUpdate(Message):
    def __init__(self, snapshot: Snapshot):
        super().__init__()
        self.snapshot = snapshot


class TokenvizApp(App):
    TITLE = "tokenviz"
    CSS_PATH = "app.tcss"
    COMMANDS: ClassVar[set] = {TokenvizCommands}  # the only provider: see command_palette
    BINDINGS = bindings()

    layer: reactive[int] = reactive(0, init=False)
    head: reactive[Head] = reactive("mean", init=False)
    cursor: reactive[int | None] = reactive(None, init=False)  # None: follow the newest token

    def __init__(self, worker: Worker, theme: str = DEFAULT_THEME):
        # NO_COLOR: Textual alone would draw in greys; native ANSI makes it drop colour altogether.
        super().__init__(ansi_color=True if "NO_COLOR" in os.environ else None)
        self.worker = worker
        self.fatal_error: str | None = None
        self.snapshot: Snapshot | None = None  # the newest from the worker
        self.snapshot_drawn: Snapshot | None = None  # the one on screen
        self._layer_chosen = False
        self._repaint_scheduled = False
        self._inspect_requested: tuple[int, int] | None = None
        self._attribute_requested: Attribute | None = None
        self._difference_requested: tuple[SplitDifference, tuple[tuple[int, str], ...]] | None = None
        self.attribution_method: AttributionMethod = "loo"  # the A key's; the palette offers both
        self._attention_requested: ShowAttention | None = None
        self._frame_cost = 0.0  # seconds to draw a frame (a moving average), see _frame_delay
        self._frame_started = 0.0
        self._frame_timer: Timer | None = None
        self._truecolor: dict[int, SkipTruecolor] = {}
        self.beam_width = BEAM_WIDTH
        for t in load_themes().values():
            self.register_theme(t)
        self.theme = theme

    def get_line_filters(self) -> Sequence[LineFilter]:
        return skipping(list(super().get_line_filters()), self._truecolor)

    def compose(self) -> ComposeResult:
        yield ProgressBar(id="loading", show_eta=False)
        yield TokensPane()
        with Horizontal(id="middle"):
            with ContentSwitcher(initial="attention", id="views"):
                yield AttentionPane(id="attention")
                for name, pane in VIEWS.items():
                    yield pane(id=name)
            yield NextTokenPane()
        yield SamplingPane()
        yield StatusLine()
        yield Footer()

    def on_mount(self) -> None:
        self._fit_layout()
        self.worker.start(lambda snapshot: self.post_message(EngineUpdate(snapshot)))  # thread-safe
        if not self.is_headless:  # a real terminal: leave it sane when the process is told to end
            loop = asyncio.get_running_loop()
            for signum in QUIT_SIGNALS:
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(signum, self._signalled)

    def _signalled(self) -> None:
        """SIGTERM or SIGHUP (the terminal closed): quit as q does, restoring the terminal. Should
        the shutdown hang (Textual's writer to a terminal that is gone can wait forever, seen while
        the engine thread imported torch), the process ends anyway after QUIT_GRACE_S."""
        ending = threading.Timer(QUIT_GRACE_S, os._exit, args=(0,))
        ending.daemon = True
        ending.start()
        self.worker.stop(timeout=0.2)
        self.exit()

    def on_unmount(self) -> None:
        self.worker.stop(timeout=0.5)

    def on_resize(self, event: events.Resize) -> None:
        self._fit_layout(event.size)  # the app's own size is the old one until the resize is done

    @on(AttentionPane.Resized)
    def _attention_resized(self) -> None:
        self._request_attention(self.query_one("#views", ContentSwitcher).current)

    def _fit_layout(self, size: Size | None = None) -> None:
        size = size or self.size
        self.screen.set_class(size.width < 120, "-narrow")
        self.screen.set_class(size.height < 30, "-short")

    def submit(self, command: Command) -> None:
        self.worker.submit(command)

    # ---- engine updates ---------------------------------------------------------------------------

    @on(EngineUpdate)
    def on_engine_update(self, message: EngineUpdate) -> None:
        s = message.snapshot
        self.snapshot = s
        if s.error:
            self.notify(s.error, severity="error", timeout=6)
        if s.notice:
            self.notify(s.notice, title="export")
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

    def _frame_delay(self, s: Snapshot) -> float:
        """While autoplay runs, frames are spaced so drawing takes at most UI_SHARE of the time: on a
        machine with few cores every frame drawn is time the model does not get."""
        drawn = self.snapshot_drawn
        if not s.playing or s.pace_s or drawn is None or not drawn.playing:  # (a set pace: the engine waits)
            return 0.0  # autoplay starting or ending is shown at once
        return max(self._frame_cost / UI_SHARE - (time.perf_counter() - self._frame_started), 0.0)

    def _measure_frame(self, seconds: float) -> None:
        """A frame's whole cost, once the screen is composed (a moving average)."""
        self._frame_cost = 0.7 * self._frame_cost + 0.3 * seconds
        self.worker.space_frames(self._frame_cost / UI_SHARE)

    def _apply_snapshot(self) -> None:
        self._repaint_scheduled, self._frame_timer = False, None
        before, s = self.snapshot_drawn, self.snapshot
        self.snapshot_drawn = s
        if s is None:
            return
        started = self._frame_started = time.perf_counter()
        self.call_after_refresh(lambda: self._measure_frame(time.perf_counter() - started))
        if s.state == "error" and s.info is None:
            self.fatal_error = s.error
        bar = self.query_one("#loading", ProgressBar)
        busy = (s.info is None and s.state != "error") or s.state == "prefilling"
        bar.set_class(not busy, "-hidden")
        # An indeterminate bar animates at 15 frames a second, hidden or not: only while busy.
        if busy and s.progress is None:
            bar.update(total=None)
        else:
            bar.update(total=1.0, progress=s.progress or 0.0)
        if s.info is not None and not self._layer_chosen:
            self.layer = s.info.layers - 1
        if before is None or before.live is not s.live:
            self.refresh_bindings()  # a recording's footer leaves out the keys that need a model
        self.refresh_panes()

    def current_selection(self) -> Selection | None:
        s = self.snapshot
        if s is None or s.info is None or not s.records:
            return None
        positions = s.prompt_len + len(s.records) - 1
        cursor = positions - 1 if self.cursor is None else min(self.cursor, positions - 1)
        return Selection(snapshot=s, layer=min(self.layer, s.info.layers - 1), head=self.head, cursor=cursor)

    def refresh_panes(self) -> None:
        if self.snapshot is None:
            return
        self.query_one(StatusLine).show(self.snapshot)
        selection = self.current_selection()
        if selection is None:
            return
        current = self.query_one("#views", ContentSwitcher).current
        tokens = self.query_one(TokensPane)
        tokens.shade_by(current_attribution(selection) if current == "attribution" else None)
        with self.batch_update():
            tokens.show(selection)
            self.query_one(f"#{current}", Pane).show(selection)
            self.query_one(NextTokenPane).show(selection)
            self.query_one(SamplingPane).show(selection)
        self._request_inspection(selection, current)
        self._request_attribution(selection, current)
        self._request_difference(selection, current)
        self._request_attention(current)

    def _request_attention(self, current: str | None) -> None:
        """The attention pane's rows are computed by the worker: ask for the layer and the rows it
        shows (around the cursor, or the newest), once per change; every snapshot then carries them."""
        pane = self.query_one(AttentionPane)
        rows = pane.rows_shown() if current == "attention" else 0
        request = ShowAttention(layer=self.layer, rows=rows, cursor=self.cursor)
        if request != self._attention_requested and (rows or self._attention_requested is not None):
            self._attention_requested = request
            self.submit(request)

    def _request_inspection(self, selection: Selection, current: str | None) -> None:
        """The lens and embedding views need the engine to look inside the cursor's position."""
        s = selection.snapshot
        if current not in INSPECTING_VIEWS or s.playing or not s.live:
            return
        if current_inspection(selection) is None and self._inspect_requested != (s.seq, selection.cursor):
            self._inspect_requested = (s.seq, selection.cursor)
            self.submit(Inspect(position=selection.cursor))

    def _request_attribution(self, selection: Selection, current: str | None) -> None:
        """The attribution view asks the worker for the token after the cursor, by the chosen method
        (a recording answers with the attributions its file kept)."""
        s = selection.snapshot
        if current != "attribution" or s.playing or selection.following_id is None:  # (a recording: the kept ones)
            return
        shown = current_attribution(selection)
        request = Attribute(position=selection.cursor, method=self.attribution_method)
        if (shown is None or shown.method != request.method) and self._attribute_requested != request:
            self._attribute_requested = request
            self.submit(request)

    def _request_difference(self, selection: Selection, current: str | None) -> None:
        """The watch view splits the logit difference of two watched tokens after the cursor."""
        s = selection.snapshot
        if current != "watch" or s.playing or len(s.pinned) < 2 or current_difference(selection) is not None:
            return
        request = (SplitDifference(position=selection.cursor), s.pinned[:2])
        if self._difference_requested != request:
            self._difference_requested = request
            self.submit(request[0])

    def watch_layer(self) -> None:
        self.refresh_panes()

    def watch_head(self) -> None:
        self.refresh_panes()

    def watch_cursor(self) -> None:
        self.refresh_panes()

    def watch_theme(self) -> None:
        self.refresh_panes()

    # ---- actions: the key table (tokenviz.ui.keys) names them ------------------------------------

    def action_step(self) -> None:
        self.cursor = None
        self.submit(Step())

    def action_autoplay(self) -> None:
        self.cursor = None
        self.submit(Play())

    def action_rewind(self) -> None:
        self.cursor = None
        self.submit(Rewind(n=1))

    def action_reset(self) -> None:
        self.cursor = None
        self.submit(Reset())

    def action_force(self, rank: int) -> None:
        """Take the rank-th candidate the panes show: the one for the position after the cursor.
        With the cursor on an earlier token, the tokens after it give way (a branch: the old path is
        kept); on the newest token it is the pending step."""
        selection = self.current_selection()
        if selection is None or self.cursor is None:
            self.submit(Force(rank=rank))
            return
        if selection.record is None:
            self.notify("inside the prompt, the next token is the prompt's own: e edits it", severity="warning")
            return
        steps_back = len(selection.snapshot.chips) - (selection.cursor + 1)
        self.cursor = None
        self.submit(BranchAt(steps_back=steps_back, rank=rank) if steps_back else Force(rank=rank))

    def action_select_branch(self, delta: int) -> None:
        pane = self.query_one(BranchPane)
        pane.selected += delta
        self._open_view("branches")

    def action_open_branch(self) -> None:
        s = self.snapshot
        pane = self.query_one(BranchPane)
        if s is None or len(s.branches) < 2:
            self.notify("there is no other branch yet", severity="warning")
            return
        target = s.branches[min(max(pane.selected, 1), len(s.branches) - 1)]
        self.cursor = None
        self.submit(SwitchBranch(index=target.index))

    def action_cancel(self) -> None:
        self.worker.cancel()

    def action_adjust(self, name: str, direction: int) -> None:
        self.submit(Adjust(name=name, direction=direction))

    def action_layer(self, delta: int) -> None:
        if self.snapshot and self.snapshot.info:
            self._layer_chosen = True
            self.layer = (self.layer + delta) % self.snapshot.info.layers

    def action_head(self, delta: int) -> None:
        if not (self.snapshot and self.snapshot.info):
            return
        cycle: list[Head] = [*HEAD_MODES, *range(self.snapshot.info.heads)]
        self.head = cycle[(cycle.index(self.head) + delta) % len(cycle)]

    def action_cursor(self, delta: int) -> None:
        selection = self.current_selection()
        if selection is None:
            return
        self.cursor = min(max(selection.cursor + delta, 0), selection.positions - 1)

    def action_scroll(self, kind: str, direction: int) -> None:
        """Scroll the open view; with the attention map open, move the token cursor by lines."""
        view = self.query_one(f"#{self.query_one('#views', ContentSwitcher).current}")
        if isinstance(view, ScrollPane):
            if kind == "line":
                view.scroll_relative(y=direction, animate=False)
            elif kind == "page":
                (view.scroll_page_down if direction > 0 else view.scroll_page_up)(animate=False)
            else:
                (view.scroll_end if direction > 0 else view.scroll_home)(animate=False)
            return
        selection = self.current_selection()
        if selection is None:
            return
        if kind == "end":
            self.cursor = None if direction > 0 else 0
            return
        tokens = self.query_one(TokensPane)
        lines = direction * (1 if kind == "line" else tokens.page_lines())
        self.cursor = min(tokens.moved_by_lines(selection.cursor, lines), selection.positions - 1)

    def action_toggle_surprisal(self) -> None:
        tokens = self.query_one(TokensPane)
        tokens.surprisal = not tokens.surprisal
        self.refresh_panes()

    def action_toggle_ids(self) -> None:
        tokens = self.query_one(TokensPane)
        tokens.show_ids = not tokens.show_ids
        self.refresh_panes()

    def action_pace(self, delta: int) -> None:
        self.submit(Pace(delta=delta))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """A recording has no model: the keys that need one are off and out of its footer."""
        recording = self.snapshot is not None and not self.snapshot.live
        return not (recording and action in MODEL_ACTIONS)

    def _open_view(self, name: str) -> None:
        if name == "attribution":
            self._attribute_requested = None  # (after an Escape, opening it again asks again)
        self.query_one("#views", ContentSwitcher).current = name
        self.refresh_panes()

    def action_view(self, name: str) -> None:
        self._open_view("attention" if self.query_one("#views", ContentSwitcher).current == name else name)

    def action_attribution(self, method: AttributionMethod) -> None:
        """The attribution view by `method` (the palette's two entries)."""
        self.attribution_method = method
        self._open_view("attribution")

    def action_beams(self, width: int | None = None) -> None:
        """Beam search from the current tokens (width 3, or the width chosen in the palette)."""
        self.beam_width = width or self.beam_width
        self.submit(Beams(width=self.beam_width, steps=BEAM_STEPS))
        self._open_view("beams")

    def action_speculate(self, drafter: str | None = None) -> None:
        """Speculative decoding from the current tokens, with the current settings. The default
        drafter, early exit at the middle layer, drafts on any text (prompt lookup needs repeats)."""
        if drafter is None:
            info = self.snapshot.info if self.snapshot else None
            drafter = f"early-exit:{info.layers // 2}" if info is not None and info.layers > 1 else "prompt-lookup"
        self.submit(Speculate(drafter=drafter, steps=SPECULATION_STEPS))
        self._open_view("speculation")

    def action_verify(self) -> None:
        self.submit(Verify())
        self._open_view("cache")

    def action_edit_prompt(self) -> None:
        """The prompt editor; for a model with a chat template it offers a chat message first."""
        s = self.snapshot
        can_chat = bool(s and s.info and s.info.chat_template)

        def submitted(choice: PromptChoice | None) -> None:
            if choice is not None:
                self.cursor = None
                system = s.system if s and choice.chat else None
                self.submit(Start(prompt=choice.text, chat=choice.chat, system=system))

        self.push_screen(PromptScreen(s.prompt if s else "", can_chat), submitted)

    def action_continue_with(self) -> None:
        """Force a text of the user's own through the journey, token by token (see Continue)."""

        def chosen(text: str | None) -> None:
            if text:
                self.cursor = None
                self.submit(Continue(text=text))

        self.push_screen(ContinueScreen(), chosen)

    def action_pin(self) -> None:
        """The watch dialog: a candidate at the cursor, or a token typed; then the watch view."""
        selection = self.current_selection()
        if selection is None:
            return
        record, prediction = selection.record, selection.prompt_prediction
        top = record.top if record is not None else prediction.top if prediction is not None else ()

        def chosen(token: int | str | None) -> None:
            if token is not None:
                self.submit(Watch(token=token))
                self._open_view("watch")

        candidates = [(c.id, c.text) for c in top[:9]]
        self.push_screen(WatchScreen(candidates, list(selection.snapshot.pinned)), chosen)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_export_svg(self) -> None:
        self._write_export(self.snapshot, self.export_screenshot(), with_journey=False)

    def action_export(self) -> None:
        """Save a screenshot (SVG) and the journey (replayable JSON) in the current directory: the
        worker writes the JSON, since the attention rows it keeps are computed where the model is."""
        if self.snapshot is None or not self.snapshot.records:
            self.notify("nothing to export yet", severity="warning")
            return
        self._write_export(self.snapshot, self.export_screenshot(), with_journey=True)

    @work(thread=True, group="export", exclusive=False)
    def _write_export(self, snapshot: Snapshot | None, svg: str, with_journey: bool) -> None:
        """Write the screenshot off the UI thread, atomically, under a name no earlier export holds;
        then ask the worker for the journey under the same name."""
        with EXPORT_LOCK:
            stem = free_name(f"tokenviz-{datetime.now():%Y%m%d-%H%M%S}", (".json", ".svg", ".html"))
            try:
                svg_path = write_file(f"{stem}.svg", svg)
            except TokenvizError as exc:
                self.call_from_thread(self.notify, str(exc), severity="error")
                return
            if with_journey:
                self.call_from_thread(
                    self.submit, Save(path=f"{stem}.json", page_colors=page_colors(self.current_theme))
                )
        self.call_from_thread(self.notify, f"saved {svg_path}", title="export")

    async def action_quit(self) -> None:
        self.worker.stop(timeout=0)  # ask it to stop; the command line ends the process (cli.exit_now)
        self.exit()
