"""The journey's screen: it composes the panes, routes the journey's keys to commands and draws
each snapshot; the tokens, a swappable view beside the next-token pane, the sampling pane below."""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any, ClassVar

from textual import events, on, work
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.geometry import Size
from textual.reactive import reactive
from textual.widgets import ContentSwitcher, ProgressBar

from tokenviz.contract.attention import HEAD_MODES, Head
from tokenviz.contract.commands import (
    Adjust,
    Assign,
    Attribute,
    Beams,
    BranchAt,
    Command,
    Constrain,
    Continue,
    Force,
    Intervene,
    PageView,
    Play,
    Request,
    Save,
    ShowAttention,
    Speculate,
    Start,
    SwitchBranch,
    Verify,
    Watch,
)
from tokenviz.contract.engine import Capability, lacking
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.interventions import HeadAblation, edit_entries
from tokenviz.contract.results import AttributionMethod
from tokenviz.contract.snapshot import Snapshot
from tokenviz.contract.worker import Worker
from tokenviz.render.units import duration
from tokenviz.ui.colors import page_colors
from tokenviz.ui.compare_screen import CompareScreen
from tokenviz.ui.fitting_footer import FittingFooter
from tokenviz.ui.keys import KEYS, PALETTE_ONLY, bindings, model_actions, model_keys, needs_of
from tokenviz.ui.panes.attention import AttentionPane
from tokenviz.ui.panes.attribution import LONG_JOB_S, AttributionPane, current_attribution, estimated_s
from tokenviz.ui.panes.base import Pane, ScrollPane
from tokenviz.ui.panes.beams import BeamPane
from tokenviz.ui.panes.branches import BranchPane
from tokenviz.ui.panes.cache import CachePane
from tokenviz.ui.panes.charts import ChartsPane
from tokenviz.ui.panes.embedding import EmbeddingPane
from tokenviz.ui.panes.lens import LensPane
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
    CompareDialog,
    ContinueScreen,
    GrammarDialog,
    HelpScreen,
    InterventionsDialog,
    LongJobScreen,
    PromptChoice,
    PromptScreen,
    SettingsDialog,
    WatchScreen,
)
from tokenviz.ui.selection import Selection
from tokenviz.ui.view_fetch import VIEW_FETCHES
from tokenviz.ui.worker_screen import WorkerScreen

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
    "routing": RoutingPane,
    "text": TextPane,
    "why": WhyPane,
}
BEAM_WIDTH = 3  # the B key's width; the palette offers 2-8
BEAM_STEPS = 10
SPECULATION_STEPS = 16
TIMED_FROM_S = 1.0  # an attribution that took this long or more times the next estimate (see estimated_s)
MODEL_ACTIONS = model_actions()  # their keys are off in a recording
MODEL_KEYS = model_keys()
KEY_ACTIONS = {key: p.action for row in KEYS for p in row.presses for key in p.key.split(",")}  # Textual's key names
PALETTE_LABELS = {p.action: p.palette or p.footer for row in KEYS for p in row.presses if p.palette or p.footer}


def capabilities(s: Snapshot) -> tuple[str, ...] | None:
    """What the engine can do, once it is known (a model loads, a server answers): None before."""
    return tuple(s.info.capabilities) if s.info is not None else None


class JourneyScreen(WorkerScreen[Snapshot]):
    KEY_ROWS = KEYS
    PALETTE_ONLY = PALETTE_ONLY
    BINDINGS: ClassVar = bindings(KEYS)
    HELP = HELP
    EXPORT_NAME = "tokenviz"
    EXPORT_SUFFIXES = (".json", ".html")

    model_layer: reactive[int] = reactive(0, init=False)  # the layer the attention map shows (0-based)
    head: reactive[Head] = reactive("mean", init=False)

    def __init__(self, worker: Worker[Snapshot]):
        super().__init__(worker)
        self._layer_chosen = False
        self._asked: dict[str, Hashable] = {}  # by view: the key of the request it last sent (see view_fetch)
        self.attribution_method: AttributionMethod = "loo"  # the A key's; the palette offers both
        self._long_attribution_ok = False  # the user ran a long leave-one-out: do not ask again
        self._attention_requested: ShowAttention | None = None
        self.beam_width = BEAM_WIDTH
        # Attribution's speed here, measured: the request sent (method, position, when), and by method
        # the (tokens, seconds) of the last run, which the next estimate scales (see estimated_s).
        self._attribution_sent: tuple[str, int, float] | None = None
        self.attribution_measured: dict[str, tuple[int, float]] = {}

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
        yield StatusLine(StatusLine.STARTING)
        yield FittingFooter()

    def on_mount(self) -> None:  # (Textual calls WorkerScreen's too, after this: it starts the worker)
        self._fit_layout()

    def draw(self, before: Snapshot | None, s: Snapshot) -> None:
        if s.state == "error" and s.info is None:
            self.fatal_error = s.error
        self._time_attribution(before, s)
        bar = self.query_one("#loading", ProgressBar)
        busy = (s.info is None and s.state != "error") or s.state == "prefilling"
        bar.set_class(not busy, "-hidden")
        # An indeterminate bar animates at 15 frames a second, hidden or not: only while busy.
        if busy and s.progress is None:
            bar.update(total=None)
        else:
            bar.update(total=1.0, progress=s.progress or 0.0)
        if s.info is not None and not self._layer_chosen:
            self.model_layer = s.info.layers - 1
        if before is None or before.live is not s.live or capabilities(before) != capabilities(s):
            self.refresh_bindings()  # the footer leaves out the keys the engine cannot serve (a recording's: a model)
        self.refresh_panes()

    def exportable(self) -> bool:
        return self.snapshot is not None and bool(self.snapshot.records)

    def export_request(self, stem: str) -> Command:
        view = PageView(layer=self.model_layer, head=str(self.head), cursor=self.cursor)
        return Save(path=f"{stem}.json", page_colors=page_colors(self.app.current_theme), page_view=view)

    def on_resize(self, event: events.Resize) -> None:
        self._fit_layout(event.size)  # the app's own size is the old one until the resize is done

    @on(AttentionPane.Resized)
    def _attention_resized(self) -> None:
        self._request_attention(self.query_one("#views", ContentSwitcher).current)

    def _fit_layout(self, size: Size | None = None) -> None:
        size = size or self.size
        self.set_class(size.width < 120, "-narrow")
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
        current = self.query_one("#views", ContentSwitcher).current
        tokens = self.query_one(TokensPane)
        tokens.shade_by(current_attribution(selection) if current == "attribution" else None)
        with self.app.batch_update():
            tokens.show(selection)
            self.query_one(f"#{current}", Pane).show(selection)
            self.query_one(NextTokenPane).show(selection)
            self.query_one(SamplingPane).show(selection)
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

    def _request_view(self, selection: Selection, current: str | None) -> None:
        """The open view's result, asked for once while the snapshot lacks it (see ui.view_fetch); a
        long leave-one-out attribution asks the user first."""
        fetch = VIEW_FETCHES.get(current or "")
        wanted = fetch.wanted(selection, self.attribution_method) if fetch else None
        if current is None or wanted is None or self._asked.get(current) == wanted[1]:
            return
        request, self._asked[current] = wanted
        if isinstance(request, Attribute):
            self.query_one(AttributionPane).declined = None
            s = selection.snapshot
            measured = self.attribution_measured.get
            loo_s = estimated_s(selection, "loo", measured("loo")) if request.method == "loo" and s.live else None
            if loo_s is not None and loo_s > LONG_JOB_S and not self._long_attribution_ok:
                self._ask_before_attributing(request, loo_s, estimated_s(selection, "grad", measured("grad")) or 0.0)
                return
            self._attribution_sent = (request.method, request.position, time.perf_counter())
        self.submit(request)

    def _time_attribution(self, before: Snapshot | None, s: Snapshot) -> None:
        """A new attribution for the request sent: how long it took, for the next estimate."""
        sent, a = self._attribution_sent, s.result(Attribute)
        if sent is None or a is None or (before is not None and before.result(Attribute) is a):
            return
        if (a.method, a.position) == sent[:2]:
            seconds = time.perf_counter() - sent[2]
            if seconds >= TIMED_FROM_S:  # (an answer kept from before comes at once: not a speed)
                self.attribution_measured[a.method] = (a.position + 1, seconds)
            self._attribution_sent = None

    def _ask_before_attributing(self, request: Attribute, loo_s: float, grad_s: float) -> None:
        n = request.position + 1

        def chosen(answer: str | None) -> None:
            if answer == "loo":
                self._long_attribution_ok = True
                self.submit(request)
            elif answer == "grad":
                self.attribution_method = "grad"
                self._asked.pop("attribution", None)
                self.refresh_panes()
            else:
                pane = self.query_one(AttributionPane)
                pane.declined = f"leave-one-out not run: about {duration(loo_s)} here. Press A twice to be asked again."
                self.refresh_panes()

        question = (
            f"Leave-one-out runs the model once for each of the {n} tokens before the cursor: about "
            f"{duration(loo_s)} on this machine (Escape cancels it midway)."
        )
        loo = (f"leave-one-out anyway, about {duration(loo_s)} (exact; not asked again)", "loo")
        grad = (f"gradient × input instead: one forward and one backward pass, about {duration(grad_s)}", "grad")
        choices = [grad, loo] if self.lacking("attribution('grad')") is None else [loo]  # (a served model: none)
        self.app.push_screen(LongJobScreen(question, choices), chosen)

    def watch_model_layer(self) -> None:
        self.refresh_panes()

    def watch_head(self) -> None:
        self.refresh_panes()

    def watch_cursor(self) -> None:
        self.refresh_panes()

    def action_force(self, rank: int) -> None:
        """Take the rank-th candidate the panes show: the one for the position after the cursor.
        With the cursor on an earlier token, the tokens after it give way (a branch: the old path is
        kept); on the newest token it is the pending step."""
        shown = self.query_one(NextTokenPane).ranks_shown
        if shown and rank not in shown:
            self.notify(
                f"candidate {rank} is not on screen (ranks {', '.join(map(str, sorted(shown)))} are): "
                "a taller terminal shows more",
                severity="warning",
            )
            return
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
        if self.query_one("#views", ContentSwitcher).current != "branches":  # no switch unseen: show them first
            self._open_view("branches")
            self.notify("the branches: < and > select one, o switches to it")
            return
        target = s.branches[min(max(pane.selected, 1), len(s.branches) - 1)]
        self.cursor = None
        self.submit(SwitchBranch(index=target.index))

    def action_adjust(self, name: str, direction: int) -> None:
        self.submit(Adjust(name=name, direction=direction))

    def _attention_in_view(self) -> None:
        """The attention map back in its pane, where another view had it: the layer and head keys
        change what it shows, which must not happen unseen."""
        if self.query_one("#views", ContentSwitcher).current != "attention":
            self._open_view("attention")

    def action_layer(self, delta: int) -> None:
        if self.snapshot and self.snapshot.info:
            self._attention_in_view()
            self._layer_chosen = True
            self.model_layer = (self.model_layer + delta) % self.snapshot.info.layers

    def action_head(self, delta: int) -> None:
        if not (self.snapshot and self.snapshot.info):
            return
        self._attention_in_view()
        cycle: list[Head] = [*HEAD_MODES, *range(self.snapshot.info.heads)]
        self.head = cycle[(cycle.index(self.head) + delta) % len(cycle)]

    def action_cursor(self, delta: int) -> None:
        """Move the token cursor; with the charts shown one at a time, change the chart instead."""
        charts = self.query_one(ChartsPane)
        if self.query_one("#views", ContentSwitcher).current == "charts" and charts.one_at_a_time:
            charts.turn(delta)
            return
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

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """A recording has no model: the keys that need one are off and out of its footer; so are
        those whose view needs a capability the engine lacks (contract.engine)."""
        recording = self.snapshot is not None and not self.snapshot.live
        if recording and action in MODEL_ACTIONS:
            return False
        whole = f"{action}({', '.join(repr(p) for p in parameters)})" if parameters else action
        return self.lacking(whole) is None

    def lacking(self, action: str, brief: bool = False) -> str | None:
        """One line saying what `action` needs that this live engine cannot do (`brief`: for a
        notification); None when it can."""
        s = self.snapshot
        needed = needs_of(action)
        if s is None or not s.live or s.info is None or needed is None:
            return None
        return lacking(s.info, needed, PALETTE_LABELS.get(action, action), brief)

    def action_help(self) -> None:
        """The help, with the keys this engine cannot serve listed at its top by what they need."""
        s, off = self.snapshot, dict[Capability | None, list[str]]()
        for key, action in KEY_ACTIONS.items():
            if self.lacking(action) is not None:
                off.setdefault(needs_of(action), []).append(key)
        note = ""
        if off and s is not None and s.info is not None:
            listed = "; ".join(f"{', '.join(keys)} ({needed})" for needed, keys in off.items())
            note = f"**Not on this engine** ({s.info.name} gives {', '.join(s.info.capabilities)}): {listed}\n\n"
        self.app.push_screen(HelpScreen(note + self.HELP))

    def on_key(self, event: events.Key) -> None:
        """A recording's keys that need a model are off; pressed, they say so and how to get one. A
        key whose view needs what the engine cannot do says so in one line."""
        s = self.snapshot
        if s is not None and not s.live and s.info is not None and event.key in MODEL_KEYS:
            self.notify(
                f"{event.key} needs the model: a recording replays what was kept. "
                f"Run it live with tokenviz --model {s.info.name} and the journey's prompt",
                severity="warning",
            )
        elif event.key in KEY_ACTIONS and (line := self.lacking(KEY_ACTIONS[event.key], brief=True)) is not None:
            self.notify(line, severity="warning")

    def _open_view(self, name: str) -> None:
        self._asked.pop(name, None)  # (after an Escape, opening it again asks again)
        self.query_one("#views", ContentSwitcher).current = name
        self.refresh_panes()

    def _showing(self, name: str, kind: type[Request[Any]]) -> bool:
        """Whether view `name` is open with something to show: its key then returns to attention
        (every view key toggles). A cancelled run's view stays: its key runs it again."""
        s = self.snapshot
        cancelled = s is not None and kind.__name__ in s.cancelled
        return self.query_one("#views", ContentSwitcher).current == name and not cancelled

    def action_view(self, name: str) -> None:
        fetch = VIEW_FETCHES.get(name)
        shown = self._showing(name, fetch.kind) if fetch else self.query_one("#views", ContentSwitcher).current == name
        self._open_view("attention" if shown else name)

    def action_attribution(self, method: AttributionMethod) -> None:
        """The attribution view by `method` (the palette's two entries)."""
        self.attribution_method = method
        self._open_view("attribution")

    def action_beams(self, width: int | None = None) -> None:
        """Beam search from the current tokens (width 3, or the width chosen in the palette). The key
        pressed again, with the beams shown, returns to attention."""
        if width is None and self._showing("beams", Beams):
            self._open_view("attention")
            return
        self.beam_width = width or self.beam_width
        self.submit(Beams(width=self.beam_width, steps=BEAM_STEPS))
        self._open_view("beams")

    def action_speculate(self, drafter: str | None = None) -> None:
        """Speculative decoding from the current tokens, with the current settings. The default
        drafter, early exit at the middle layer, drafts on any text (prompt lookup needs repeats). The
        key pressed again, with the run shown, returns to attention."""
        if drafter is None and self._showing("speculation", Speculate):
            self._open_view("attention")
            return
        if drafter is None:
            info = self.snapshot.info if self.snapshot else None
            drafter = f"early-exit:{info.layers // 2}" if info is not None and info.layers > 1 else "prompt-lookup"
        self.submit(Speculate(drafter=drafter, steps=SPECULATION_STEPS))
        self._open_view("speculation")

    def action_verify(self) -> None:
        if self._showing("cache", Verify) and self.snapshot is not None and self.snapshot.result(Verify) is not None:
            self._open_view("attention")
            return
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

        chat = s.chat if s and s.records else True  # a first prompt is offered as a chat message
        context = s.info.context if s and s.info else None
        editor = PromptScreen(s.prompt if s else "", can_chat, chat, count=self.worker.count_tokens, context=context)
        self.app.push_screen(editor, submitted)

    def action_continue_with(self) -> None:
        """Force a text of the user's own through the journey, token by token (see Continue)."""

        def chosen(text: str | None) -> None:
            if text:
                self.cursor = None
                self.submit(Continue(text=text))

        self.app.push_screen(ContinueScreen(), chosen)

    def action_assign(self) -> None:
        """Type any setting (see Assign): checked here against the settings in view, so a mistake is one
        line and nothing changes."""
        s = self.snapshot

        def chosen(line: str | None) -> None:
            if not line or s is None:
                return
            assignments = tuple(line.split())
            try:
                s.settings.changed(assignments)
            except TokenvizError as exc:
                self.notify(str(exc), severity="error")
                return
            self.submit(Assign(assignments))

        self.app.push_screen(SettingsDialog(), chosen)

    def action_grammar(self) -> None:
        """Set, change or clear the grammar (see Constrain): the file is read and checked off the UI's
        thread (read_grammar), so nothing it turns out to be can hold the app."""

        def chosen(line: str | None) -> None:
            if line is not None:
                self.read_grammar(line)

        s = self.snapshot
        self.app.push_screen(GrammarDialog(s.settings.grammar if s else None), chosen)

    @work(thread=True, group="grammar")
    def read_grammar(self, line: str) -> None:
        from tokenviz.files.grammar_file import grammar_from_line  # (the engine's import waits until asked)

        try:
            grammar = grammar_from_line(line)
        except TokenvizError as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error")
            return
        self.app.call_from_thread(self.submit, Constrain(grammar=grammar))

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

        self.app.push_screen(InterventionsDialog(entries, begun), chosen)

    def action_ablate_head(self) -> None:
        """Zero-ablate the head the attention map shows, or restore it where it is ablated so."""
        s = self.snapshot
        if s is None or s.info is None:
            return
        if not isinstance(self.head, int):
            self.notify(
                "the attention map shows a head's mean or max: choose one head with h first", severity="warning"
            )
            return
        ablation = HeadAblation(layer=min(self.model_layer, s.info.layers - 1), head=self.head)
        kept = tuple(entry for entry in s.interventions if entry[0] != ablation)
        self.submit(Intervene(kept if len(kept) < len(s.interventions) else (*kept, (ablation, True))))

    def action_pin(self) -> None:
        """The watch dialog: a candidate at the cursor, or a token typed. The views stay as they are (W
        shows the watched tokens: it toggles, so w opening it would make the W after it close it)."""
        selection = self.current_selection()
        if selection is None:
            return
        record, prediction = selection.record, selection.prompt_prediction
        top = record.top if record is not None else prediction.top if prediction is not None else ()

        def chosen(token: int | str | None) -> None:
            if token is not None:
                self.submit(Watch(token=token))
                if self.query_one("#views", ContentSwitcher).current != "watch":
                    self.notify("watched at every step: W shows the watched tokens over the steps", timeout=4)

        candidates = [(c.id, c.text) for c in top[:9]]
        self.app.push_screen(WatchScreen(candidates, list(selection.snapshot.pinned)), chosen)

    def action_compare(self) -> None:
        """Compare this journey's settings with others, side by side, on this model (the palette's)."""
        s = self.snapshot
        if s is None or s.info is None:
            self.notify("the model has not loaded yet", severity="warning")
            return

        def chosen(text: str | None) -> None:
            if not text:
                return
            try:
                against = s.settings.changed(text.split())
                worker = self.worker.compare(s.settings, against, Start(s.prompt, s.chat, s.system))
            except TokenvizError as exc:
                self.notify(str(exc), severity="error")
                return
            self.submit(Play(on=False))
            self.app.push_screen(CompareScreen(worker))

        self.app.push_screen(CompareDialog(), chosen)
