"""The journey's screen: it composes the panes, routes the journey's keys to commands and draws
each snapshot; the tokens, a swappable view beside the next-token pane, the sampling pane below."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar

from textual import events, on
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.geometry import Size
from textual.reactive import reactive
from textual.widgets import ContentSwitcher, ProgressBar

from tokenviz.contract.attention import Head
from tokenviz.contract.commands import (
    AddSae,
    Attribute,
    Command,
    Inspect,
    Intervene,
    PageView,
    Request,
    Save,
    ShowAttention,
    ShowLens,
)
from tokenviz.contract.engine import Capability
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.interventions import edit_entries, entries_changed
from tokenviz.contract.snapshot import Snapshot
from tokenviz.contract.worker import Worker
from tokenviz.render.units import elapsed
from tokenviz.ui.colors import page_colors
from tokenviz.ui.compare_screen import CompareScreen
from tokenviz.ui.fitting_footer import FittingFooter
from tokenviz.ui.key_gating import action_on, key_refusal, keys_off, what_it_lacks
from tokenviz.ui.keys import (
    JOURNEY_OWNERS,
    KEYS,
    PALETTE_ONLY,
    bindings,
)
from tokenviz.ui.panes.attention import AttentionPane
from tokenviz.ui.panes.attribution import AttributionPane, current_attribution
from tokenviz.ui.panes.base import Pane, ScrollPane
from tokenviz.ui.panes.beams import BeamPane
from tokenviz.ui.panes.branches import BranchPane
from tokenviz.ui.panes.cache import CachePane
from tokenviz.ui.panes.charts import ChartsPane
from tokenviz.ui.panes.embedding import EmbeddingPane
from tokenviz.ui.panes.features import FeaturesPane
from tokenviz.ui.panes.host import JourneyHost
from tokenviz.ui.panes.lens import LensPane, every_lens_row, lens_rows_shown
from tokenviz.ui.panes.model import ModelPane
from tokenviz.ui.panes.next_token import NextTokenPane
from tokenviz.ui.panes.routing import RoutingPane
from tokenviz.ui.panes.sampling import SamplingPane
from tokenviz.ui.panes.speculation import SpeculationPane
from tokenviz.ui.panes.status import StatusLine
from tokenviz.ui.panes.text import TextPane
from tokenviz.ui.panes.timing import TimingPane
from tokenviz.ui.panes.tokens import TokensPane
from tokenviz.ui.panes.watch import WatchPane
from tokenviz.ui.panes.why import WhyPane
from tokenviz.ui.screens import (
    HELP,
    HelpScreen,
    InterventionsDialog,
    SaeDialog,
)
from tokenviz.ui.selection import Selection
from tokenviz.ui.view_fetch import VIEW_FETCHES, Room
from tokenviz.ui.worker_screen import WorkerScreen

# The views that can take the attention pane's place, by widget id. A view's key pressed again
# returns to attention.
WIDE_FROM = 180  # columns from which the layout is wide (app.tcss's .-wide)
SLOW_STEP = 3.0  # a step's pass this many times the fastest of the last ones is said (_say_a_slow_step)
STEPS_COMPARED = 20
STEPS_BEFORE_SAYING = 4
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
    "routing": RoutingPane,
    "features": FeaturesPane,
    "text": TextPane,
    "why": WhyPane,
}


def capabilities(s: Snapshot) -> tuple[str, ...] | None:
    """What the engine can do, once it is known (a model loads, a server answers): None before."""
    return tuple(s.info.capabilities) if s.info is not None else None


class JourneyScreen(WorkerScreen[Snapshot]):
    KEY_ROWS = KEYS
    PALETTE_ONLY = PALETTE_ONLY
    BINDINGS: ClassVar = bindings(KEYS, JOURNEY_OWNERS)
    ACTION_OWNERS = JOURNEY_OWNERS
    HELP = HELP
    EXPORT_NAME = "tokenviz"
    EXPORT_SUFFIXES = (".json", ".html")

    model_layer: reactive[int] = reactive(0, init=False)  # the layer the attention map shows (0-based)
    head: reactive[Head] = reactive("mean", init=False)

    def __init__(self, worker: Worker[Snapshot]):
        super().__init__(worker)
        self._asked: dict[str, Hashable] = {}  # by view: the key of the request it last sent (see view_fetch)
        self._attention_requested: ShowAttention | None = None
        self._lens_requested = ShowLens()  # the lens kept at the newest position, standing (none yet)
        self._slow_said = False  # a slow step was said (once a journey: see _say_a_slow_step)

    def compose(self) -> ComposeResult:
        yield ProgressBar(id="loading", show_eta=False)
        yield TokensPane(id="tokens")
        with Horizontal(id="middle"):
            with ContentSwitcher(initial="attention", id="views"):
                yield AttentionPane(id="attention")
                for name, pane in VIEWS.items():
                    yield pane(id=name)
            yield NextTokenPane(id="next-token")
        yield SamplingPane(id="sampling")
        yield StatusLine(StatusLine.STARTING)
        yield FittingFooter()

    def on_mount(self) -> None:  # Textual calls WorkerScreen's too, after this: it starts the worker
        self._fit_layout()

    def draw(self, before: Snapshot | None, s: Snapshot) -> None:
        if s.state == "error" and s.info is None:
            self.fatal_error = s.error
        self.query_one(AttributionPane).timed(before, s)
        bar = self.query_one("#loading", ProgressBar)
        busy = (s.info is None and s.state != "error") or s.state == "prefilling"
        bar.set_class(not busy, "-hidden")
        # An indeterminate bar animates at 15 frames a second, hidden or not: only while busy.
        if busy and s.progress is None:
            bar.update(total=None)
        else:
            bar.update(total=1.0, progress=s.progress or 0.0)
        if s.info is not None and not self.query_one(AttentionPane).layer_chosen:
            self.model_layer = s.info.layers - 1
        if before is None or before.live is not s.live or capabilities(before) != capabilities(s):
            self.refresh_bindings()  # the footer leaves out the keys the engine cannot serve (a recording's: a model)
        self._say_a_slow_step(before, s)
        self.refresh_panes()

    def _say_a_slow_step(self, before: Snapshot | None, s: Snapshot) -> None:
        """Once a journey, on a runtime whose threads are the user's choice (ModelInfo.threads): a step whose
        forward pass took SLOW_STEP times the fastest of the last ones says so and names --threads. On a busy
        machine llama.cpp's threads spin while they wait for each other: at a load of 7, two threads took
        47-56 ms a step where one took 12-17 (UX 7's finding 6)."""
        if self._slow_said or s.info is None or not s.info.threads or not s.live:
            return
        if before is None or len(s.records) <= len(before.records):
            return
        steps = [r.forward_ms for r in s.records[max(1, len(s.records) - STEPS_COMPARED) :] if r.forward_ms > 0]
        if len(steps) < STEPS_BEFORE_SAYING:
            return
        best, latest = min(steps[:-1]), steps[-1]
        if latest > SLOW_STEP * best:
            self._slow_said = True
            threads = f"{s.info.threads} thread{'s' if s.info.threads != 1 else ''}"
            self.notify(
                f"this step's pass took {latest / best:.1f}× the fastest of the last {len(steps)} "
                f"({elapsed(latest)} against {elapsed(best)}): on a busy machine the runtime's {threads} wait for "
                "each other; --threads 1 may be faster",
                timeout=15,
            )

    def exportable(self) -> bool:
        return self.snapshot is not None and bool(self.snapshot.records)

    def export_request(self, stem: str) -> Command:
        view = PageView(layer=self.model_layer, head=str(self.head), cursor=self.cursor)
        return Save(path=f"{stem}.json", page_colors=page_colors(self.app.current_theme), page_view=view)

    def on_resize(self, event: events.Resize) -> None:
        self._fit_layout(event.size)  # the app's own size is the old one until the resize is done

    @on(SamplingPane.CompareAsked)
    def _open_comparison(self, message: SamplingPane.CompareAsked) -> None:
        self.app.push_screen(CompareScreen(message.worker))

    @on(AttentionPane.Resized)
    def _attention_resized(self) -> None:
        self._request_attention(self.current_view)

    @on(LensPane.Resized)
    def _lens_resized(self) -> None:
        selection = self.current_selection()
        if selection is not None and self.current_view == "lens":
            self._request_lens(selection, self.current_view)
            self._request_view(selection, self.current_view)

    def _fit_layout(self, size: Size | None = None) -> None:
        size = size or self.size
        self.set_class(size.width < 120, "-narrow")
        self.set_class(size.width >= WIDE_FROM, "-wide")  # (the next-token pane's pieces whole, not cut at 16)
        self.set_class(size.height < 30, "-short")

    def current_selection(self) -> Selection | None:
        s = self.snapshot
        if s is None or s.info is None or not s.records:
            return None
        positions = s.prompt_len + len(s.records) - 1
        cursor = positions - 1 if self.cursor is None else min(self.cursor, positions - 1)
        return Selection(
            snapshot=s, info=s.info, layer=min(self.model_layer, s.info.layers - 1), head=self.head, cursor=cursor
        )

    def refresh_panes(self) -> None:
        if self.snapshot is None:
            return
        self.query_one(StatusLine).show(self.snapshot)
        selection = self.current_selection()
        if selection is None:
            self._show_prefilling(self.snapshot)
            return
        current = self.current_view
        tokens = self.query_one(TokensPane)
        tokens.shade_by(current_attribution(selection) if current == "attribution" else None)
        with self.app.batch_update():
            tokens.show(selection)
            self.query_one(f"#{current}", Pane).show(selection)
            self.query_one(NextTokenPane).show(selection)
            self.query_one(SamplingPane).show(selection)
        self._request_lens(selection, current)
        self._request_view(selection, current)
        self._request_attention(current)

    def _show_prefilling(self, s: Snapshot) -> None:
        """A first prompt being prefilled: its tokens are known, the other panes wait for its pass."""
        if s.info is not None and s.chips and not s.records:
            last = len(s.chips) - 1
            self.query_one(TokensPane).show(Selection(snapshot=s, info=s.info, layer=0, head=self.head, cursor=last))

    def _request_attention(self, current: str | None) -> None:
        """The attention pane's rows are computed by the worker: ask for the layer and the rows it
        shows (around the cursor, or the newest), once per change; every snapshot then carries them."""
        pane = self.query_one(AttentionPane)
        rows = pane.rows_shown() if current == "attention" else 0
        request = ShowAttention(layer=self.model_layer, rows=rows, cursor=self.cursor)
        if request != self._attention_requested and (rows or self._attention_requested is not None):
            self._attention_requested = request
            self.submit(request)

    def _request_lens(self, selection: Selection, current: str | None) -> None:
        """The lens and embedding views open on the newest position stand as one request (ShowLens): each
        step's frame then carries its rows, during autoplay too, and no Inspect follows the frame. On an
        earlier position, or closed, none stands (an earlier position's is asked once: _request_view)."""
        rows: tuple[int, ...] = ()
        every = every_lens_row(selection)
        if current in ("lens", "embedding") and self.cursor is None and selection.snapshot.live:
            rows = every if current == "embedding" else lens_rows_shown(selection, self.query_one(LensPane).rows_room())
        request = ShowLens(None if rows and rows == every else rows)
        if request != self._lens_requested:
            self._lens_requested = request
            self.submit(request)

    def _request_view(self, selection: Selection, current: str | None) -> None:
        """The open view's result, asked for once while the snapshot lacks it (see ui.view_fetch); a
        long leave-one-out attribution asks the user first."""
        attribution = self.query_one(AttributionPane)
        fetch = VIEW_FETCHES.get(current or "")
        room = Room(attribution.method, self.query_one(LensPane).rows_room())
        wanted = fetch.wanted(selection, room) if fetch else None
        if current is None or wanted is None or self._asked.get(current) == wanted[1]:
            return
        if isinstance(wanted[0], Inspect) and self._lens_requested.rows != ():
            return  # the standing lens brings it with the frame
        request, self._asked[current] = wanted
        if not isinstance(request, Attribute) or attribution.send_now(request, selection):
            self.submit(request)

    def watch_model_layer(self) -> None:
        self.refresh_panes()

    def watch_head(self) -> None:
        self.refresh_panes()

    def watch_cursor(self) -> None:
        self.refresh_panes()

    def action_jump(self, position: int) -> None:
        """The token cursor to `position` (a link's: the why view's least sure steps)."""
        selection = self.current_selection()
        if selection is not None:
            self.cursor = min(max(position, 0), selection.positions - 1)

    def action_cursor(self, delta: int) -> None:
        """Move the token cursor; with the charts shown one at a time, change the chart instead."""
        charts = self.query_one(ChartsPane)
        if self.current_view == "charts" and charts.one_at_a_time:
            charts.turn(delta)
            return
        selection = self.current_selection()
        if selection is None:
            return
        self.cursor = min(max(selection.cursor + delta, 0), selection.positions - 1)

    def action_scroll(self, kind: str, direction: int) -> None:
        """Scroll the open view; with the attention map open, move the token cursor by lines."""
        view = self.query_one(f"#{self.current_view}")
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

    async def action_route(self, owner: str, action: str) -> None:
        """A pane's own action (see keys.Press.owner), run on the pane as Textual runs a widget's."""
        await self.query_one(f"#{owner}").run_action(action)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return action_on(self.snapshot, action, parameters)  # see ui.key_gating

    def refusal_of(self, action: str, brief: bool = False) -> str | None:
        return what_it_lacks(self.snapshot, action, brief)

    def action_help(self) -> None:
        """The help, with the keys this engine cannot serve listed at its top by what they need."""
        self.app.push_screen(HelpScreen(keys_off(self.snapshot) + self.HELP))

    def on_key(self, event: events.Key) -> None:
        """A key that is off says so, and why, in one line (see ui.key_gating)."""
        line = key_refusal(self.snapshot, event.key)
        if line is not None:
            self.notify(line, severity="warning")

    @property
    def current_view(self) -> str | None:
        return self.query_one("#views", ContentSwitcher).current

    def open_view(self, name: str) -> None:
        self._asked.pop(name, None)  # after an Escape, opening it again asks again
        self.query_one("#views", ContentSwitcher).current = name
        self.refresh_panes()

    def showing(self, name: str, kind: type[Request[Any]]) -> bool:
        """Whether view `name` is open with something to show: its key then returns to attention
        (every view key toggles). A cancelled run's view stays: its key runs it again."""
        s = self.snapshot
        cancelled = s is not None and kind.__name__ in s.cancelled
        return self.current_view == name and not cancelled

    def action_view(self, name: str) -> None:
        fetch = VIEW_FETCHES.get(name)
        shown = self.showing(name, fetch.kind) if fetch else self.current_view == name
        self.open_view("attention" if shown else name)

    def submit(self, command: Command) -> None:
        """As every screen's; an edit of the interventions is said at once (the model runs again under it,
        which a large model on a busy machine takes seconds to do: a key must not look ignored)."""
        s = self.snapshot
        if isinstance(command, Intervene) and s is not None:
            self.notify(f"{entries_changed(s.interventions, command.entries)} · the model runs again with it…")
        super().submit(command)

    def action_add_sae(self) -> None:
        """The SAE dialog: a folder, loaded beside the model (see AddSae), then the features view."""

        def chosen(folder: str | None) -> None:
            if folder:
                self.submit(AddSae(folder=folder.strip()))
                self.open_view("features")

        self.app.push_screen(SaeDialog(), chosen)

    def action_interventions(self, begun: str = "") -> None:
        """The interventions dialog: the list, and one edit typed (see Intervene), begun with `begun`."""
        s = self.snapshot
        entries = s.interventions if s else ()

        def chosen(line: str | None) -> None:
            if line is None:
                return
            try:
                self.submit(Intervene(edit_entries(line, entries)))
            except TokenvizError as exc:
                self.notify(str(exc), severity="error")

        ablates = s is None or s.info is None or Capability.ABLATION.value in s.info.capabilities
        example = InterventionsDialog.PLACEHOLDER if ablates else "steer-tokens 5:8: Paris: the"
        self.app.push_screen(InterventionsDialog(entries, begun, example), chosen)


def as_host(screen: JourneyScreen) -> JourneyHost:
    """The screen as its panes' actions reach it (mypy checks here that it gives all they use)."""
    return screen
