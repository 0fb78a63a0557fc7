"""The Textual app: panes, keys, themes. It renders Snapshots and sends commands; it never
touches torch. The engine runs in the bridge's thread."""

from __future__ import annotations

from functools import partial
from typing import Callable

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.command import Hit, Hits, Provider
from textual.containers import Horizontal
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import ContentSwitcher, Footer, ProgressBar

from tokenviz.bridge import EngineBridge, Snapshot
from tokenviz.render.attention import HEAD_MODES
from tokenviz.settings import SamplingSettings
from tokenviz.themes import DEFAULT_THEME, load_themes
from tokenviz.widgets import AttentionPane, NextTokenPane, SamplingPane, StatusLine, TokensPane
from tokenviz.widgets.beams import BeamPane
from tokenviz.widgets.branches import BranchPane
from tokenviz.widgets.cache import CachePane
from tokenviz.widgets.embedding import EmbeddingPane
from tokenviz.widgets.lens import LensPane, current_inspection
from tokenviz.widgets.screens import HelpScreen, PromptScreen
from tokenviz.widgets.speculation import SpeculationPane
from tokenviz.widgets.timing import TimingPane
from tokenviz.widgets.view import View

# The views of the middle-left area, by widget id. A view's key pressed again returns to attention.
VIEWS = {"lens": LensPane, "embedding": EmbeddingPane, "cache": CachePane, "timing": TimingPane,
         "beams": BeamPane, "branches": BranchPane, "speculation": SpeculationPane}


class EngineUpdate(Message):
    def __init__(self, snapshot: Snapshot):
        super().__init__()
        self.snapshot = snapshot


class TokenvizCommands(Provider):
    """Command palette entries beyond Textual's own (which already lists the themes)."""

    async def search(self, query: str) -> Hits:
        app = self.app
        assert isinstance(app, TokenvizApp)
        entries = [
            ("Step: take the pending token", app.action_step),
            ("Autoplay on/off", app.action_autoplay),
            ("Rewind one step", app.action_rewind),
            ("Reset to the prompt", app.action_reset),
            ("Edit the prompt", app.action_edit_prompt),
            ("Greedy on/off", partial(app.action_adjust, "greedy", 1)),
            ("New seed", partial(app.action_adjust, "seed", 1)),
            ("Min-p up", partial(app.action_adjust, "min_p", 1)),
            ("Min-p down", partial(app.action_adjust, "min_p", -1)),
            ("Repetition penalty up", partial(app.action_adjust, "repetition_penalty", 1)),
            ("Repetition penalty down", partial(app.action_adjust, "repetition_penalty", -1)),
            ("View: logit lens", partial(app.action_view, "lens")),
            ("View: embedding and position", partial(app.action_view, "embedding")),
            ("View: KV cache", partial(app.action_view, "cache")),
            ("View: timing", partial(app.action_view, "timing")),
            ("View: branch tree", partial(app.action_view, "branches")),
            ("Switch to the selected branch", app.action_open_branch),
            ("Verify the KV cache against a full recompute", app.action_verify),
            *[(f"Beam search, width {w}", partial(app.action_beams, w)) for w in range(2, 9)],
            ("Speculative decoding: prompt lookup", partial(app.action_speculate, "prompt-lookup")),
            *([(f"Speculative decoding: early exit at layer {app.snapshot.info.layers // 2}",
                partial(app.action_speculate, f"early-exit:{app.snapshot.info.layers // 2}"))]
              if app.snapshot and app.snapshot.info and app.snapshot.info.layers > 1 else []),
            ("Model info", app.action_model_info),
            ("Export the journey (JSON) and a screenshot (SVG)", app.action_export),
            ("Export an SVG screenshot", app.action_export_svg),
            ("Help: what each pane shows", app.action_help),
        ]
        for name in sorted(app.available_themes):
            if name.startswith("tokenviz"):
                entries.append((f"Theme: {name}", partial(setattr, app, "theme", name)))
        matcher = self.matcher(query)
        for label, callback in entries:
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), callback, help=None)


class TokenvizApp(App):
    TITLE = "tokenviz"
    COMMANDS = App.COMMANDS | {TokenvizCommands}
    CSS = """
    Screen { layout: vertical; }
    #loading { height: 1; margin: 0 1; }
    #loading.-hidden { display: none; }
    TokensPane { height: 7; }
    #middle { height: 1fr; }
    #middle > * { height: 100%; }
    #views { width: 1fr; }
    #views > * { height: 100%; }
    NextTokenPane { width: 56; }
    SamplingPane { height: 15; }
    Screen.-narrow TokensPane { height: 5; }
    Screen.-narrow NextTokenPane { width: 40; }
    Screen.-narrow SamplingPane { height: 9; }
    Screen.-short TokensPane { height: 4; }
    Screen.-short SamplingPane { height: 8; }
    """
    BINDINGS = [
        Binding("space,n", "step", "step"),
        Binding("a", "autoplay", "play/pause"),
        Binding("backspace", "rewind", "rewind"),
        Binding("r", "reset", "reset"),
        Binding("e", "edit_prompt", "prompt"),
        Binding("t", "adjust('temperature', -1)", "temp-", show=False),
        Binding("T", "adjust('temperature', 1)", "temp±"),
        Binding("k", "adjust('top_k', -1)", "top-k-", show=False),
        Binding("K", "adjust('top_k', 1)", "top-k±"),
        Binding("p", "adjust('top_p', -1)", "top-p-", show=False),
        Binding("P", "adjust('top_p', 1)", "top-p±"),
        Binding("g", "adjust('greedy', 1)", "greedy"),
        Binding("s", "adjust('seed', 1)", "seed"),
        Binding("left_square_bracket", "layer(-1)", "layer-", show=False),
        Binding("right_square_bracket", "layer(1)", "layer±"),
        Binding("h", "head(1)", "head±"),
        Binding("H", "head(-1)", "head-", show=False),
        *[Binding(str(i), f"force({i})", f"force #{i}", show=False) for i in range(1, 10)],
        Binding("left", "cursor(-1)", "cursor-", show=False),
        Binding("right", "cursor(1)", "cursor+", show=False),
        Binding("l", "view('lens')", "lens"),
        Binding("m", "view('embedding')", "embedding", show=False),
        Binding("c", "view('cache')", "KV cache", show=False),
        Binding("i", "view('timing')", "timing", show=False),
        Binding("v", "verify", "verify cache", show=False),
        Binding("x", "export", "export"),
        Binding("B", "beams", "beam search", show=False),
        Binding("S", "speculate", "speculate", show=False),
        Binding("b", "view('branches')", "branches", show=False),
        Binding("less_than_sign", "select_branch(-1)", "previous branch", show=False),
        Binding("greater_than_sign", "select_branch(1)", "next branch", show=False),
        Binding("o", "open_branch", "switch branch", show=False),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
    ]

    layer: reactive[int] = reactive(0, init=False)
    head: reactive[int | str] = reactive("mean", init=False)
    cursor: reactive[int | None] = reactive(None, init=False)  # None: follow the newest token

    def __init__(self, prompt: str = "", model: str | None = None, device: str = "auto", dtype: str = "auto",
                 trust_remote_code: bool = False, settings: SamplingSettings | None = None,
                 theme: str = DEFAULT_THEME, loader: Callable | None = None, bridge_factory: Callable | None = None):
        super().__init__()
        self.fatal_error: str | None = None
        self.snapshot: Snapshot | None = None
        self._layer_chosen = False
        self._repaint_scheduled = False
        self._inspect_requested = None
        self.beam_width = 3
        for t in load_themes().values():
            self.register_theme(t)
        self.theme = theme
        if loader is None:
            def loader(progress):  # runs in the engine thread: torch is imported there, after the first frame
                from tokenviz.engine.loading import load_model

                return load_model(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                                  progress=progress)
        post = lambda snapshot: self.post_message(EngineUpdate(snapshot))  # noqa: E731 (thread-safe)
        factory = bridge_factory or EngineBridge
        self.bridge = factory(post=post, loader=loader, settings=settings or SamplingSettings(), prompt=prompt)

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
        self.bridge.start()

    def on_unmount(self) -> None:
        self.bridge.stop(timeout=0.5)

    def on_resize(self) -> None:
        self._fit_layout()

    def _fit_layout(self) -> None:
        self.screen.set_class(self.size.width < 120, "-narrow")
        self.screen.set_class(self.size.height < 30, "-short")

    # ---- engine updates ---------------------------------------------------------------------------

    @on(EngineUpdate)
    def on_engine_update(self, message: EngineUpdate) -> None:
        s = message.snapshot
        self.snapshot = s
        if s.error:
            self.notify(s.error, severity="error", timeout=6)
        # Snapshots queued behind this one make it stale: repaint once, after the queue drains.
        if not self._repaint_scheduled:
            self._repaint_scheduled = True
            self.call_later(self._apply_snapshot)

    def _apply_snapshot(self) -> None:
        self._repaint_scheduled = False
        s = self.snapshot
        if s.state == "error" and s.info is None:
            self.fatal_error = s.error
        bar = self.query_one("#loading", ProgressBar)
        bar.set_class(s.info is not None or s.state == "error", "-hidden")
        if s.progress is not None:
            bar.update(total=1.0, progress=s.progress)
        if s.info is not None and not self._layer_chosen:
            self.layer = s.info.layers - 1
        self.refresh_panes()

    def current_view(self) -> View | None:
        s = self.snapshot
        if s is None or s.info is None or not s.records:
            return None
        positions = s.prompt_len + len(s.records) - 1
        cursor = positions - 1 if self.cursor is None else min(self.cursor, positions - 1)
        return View(snapshot=s, layer=min(self.layer, s.info.layers - 1), head=self.head, cursor=cursor)

    def refresh_panes(self) -> None:
        if self.snapshot is None:
            return
        self.query_one(StatusLine).show(self.snapshot)
        view = self.current_view()
        if view is None:
            return
        current = self.query_one("#views", ContentSwitcher).current
        with self.batch_update():
            self.query_one(TokensPane).show(view)
            self.query_one(f"#{current}").show(view)
            self.query_one(NextTokenPane).show(view)
            self.query_one(SamplingPane).show(view)
        self._request_inspection(view, current)

    def _request_inspection(self, view: View, current: str) -> None:
        """The lens and embedding views need the engine to look inside the cursor's position."""
        if current not in ("lens", "embedding") or view.snapshot.playing or not view.snapshot.live:
            return
        if current_inspection(view) is None and self._inspect_requested != (view.snapshot.seq, view.cursor):
            self._inspect_requested = (view.snapshot.seq, view.cursor)
            self.bridge.submit("inspect", position=view.cursor)

    def watch_layer(self) -> None:
        self.refresh_panes()

    def watch_head(self) -> None:
        self.refresh_panes()

    def watch_cursor(self) -> None:
        self.refresh_panes()

    def watch_theme(self) -> None:
        self.refresh_panes()

    # ---- actions ----------------------------------------------------------------------------------------

    def action_step(self) -> None:
        self.cursor = None
        self.bridge.submit("step")

    def action_autoplay(self) -> None:
        self.cursor = None
        self.bridge.submit("toggle_play")

    def action_rewind(self) -> None:
        self.cursor = None
        self.bridge.submit("rewind", n=1)

    def action_reset(self) -> None:
        self.cursor = None
        self.bridge.submit("reset")

    def action_force(self, rank: int) -> None:
        """Take the rank-th token instead: at the pending step, or, with the cursor moved onto an
        earlier generated token, at that token (a branch: the old path is kept)."""
        view = self.current_view()
        if self.cursor is not None and view is not None and view.cursor >= view.snapshot.prompt_len:
            steps_back = len(view.snapshot.chips) - view.cursor
            self.cursor = None
            self.bridge.submit("branch", steps_back=steps_back, rank=rank)
            return
        self.cursor = None
        self.bridge.submit("force", rank=rank)

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
        self.bridge.submit("switch_branch", index=target.index)

    def action_adjust(self, name: str, direction: int) -> None:
        self.bridge.submit("adjust", name=name, direction=direction)

    def action_layer(self, delta: int) -> None:
        if self.snapshot and self.snapshot.info:
            self._layer_chosen = True
            self.layer = (self.layer + delta) % self.snapshot.info.layers

    def action_head(self, delta: int) -> None:
        if not (self.snapshot and self.snapshot.info):
            return
        cycle = [*HEAD_MODES, *range(self.snapshot.info.heads)]
        self.head = cycle[(cycle.index(self.head) + delta) % len(cycle)]

    def action_cursor(self, delta: int) -> None:
        view = self.current_view()
        if view is None:
            return
        self.cursor = min(max(view.cursor + delta, 0), view.positions - 1)

    def _open_view(self, name: str) -> None:
        self.query_one("#views", ContentSwitcher).current = name
        self.refresh_panes()

    def action_view(self, name: str) -> None:
        self._open_view("attention" if self.query_one("#views", ContentSwitcher).current == name else name)

    def action_beams(self, width: int | None = None) -> None:
        """Beam search from the current tokens (width 3, or the width chosen in the palette)."""
        self.beam_width = width or self.beam_width
        self.bridge.submit("beams", width=self.beam_width, steps=10)
        self._open_view("beams")

    def action_speculate(self, drafter: str = "prompt-lookup") -> None:
        """Speculative decoding of 16 tokens from the current tokens, with the current settings."""
        self.bridge.submit("speculate", drafter=drafter, steps=16)
        self._open_view("speculation")

    def action_verify(self) -> None:
        self.bridge.submit("verify")
        self._open_view("cache")

    def action_edit_prompt(self) -> None:
        def submitted(prompt: str | None) -> None:
            if prompt is not None:
                self.cursor = None
                self.bridge.submit("start", prompt=prompt)

        self.push_screen(PromptScreen(self.snapshot.prompt if self.snapshot else ""), submitted)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_model_info(self) -> None:
        s = self.snapshot
        if s is None or s.info is None:
            self.notify("the model is still loading")
            return
        i = s.info
        self.notify(
            f"{i.name} ({i.architecture}): {i.layers} layers, {i.heads} query heads sharing {i.kv_heads} KV heads "
            f"of {i.head_dim}, hidden {i.hidden}, vocab {i.vocab}, context {i.context}, positions {i.positions}"
            f"{', tied input/output embeddings' if i.tied_embeddings else ''}; {i.device}, {i.dtype}",
            title="model", timeout=12,
        )

    def action_export_svg(self) -> None:
        path = self.save_screenshot()
        self.notify(f"saved {path}")

    def action_export(self) -> None:
        """Save the journey (replayable JSON) and a screenshot (SVG) in the current directory."""
        from datetime import datetime

        from tokenviz.errors import TokenvizError
        from tokenviz.journey import save_journey

        if self.snapshot is None or not self.snapshot.records:
            self.notify("nothing to export yet", severity="warning")
            return
        stem = f"tokenviz-{datetime.now():%Y%m%d-%H%M%S}"
        try:
            saved = save_journey(f"{stem}.json", self.snapshot)
        except TokenvizError as exc:
            self.notify(str(exc), severity="error")
            return
        svg = self.save_screenshot(f"{stem}.svg", path=".")
        self.notify(f"saved {saved} (tokenviz replay {saved}) and {svg}", title="export")

    async def action_quit(self) -> None:
        self.bridge.stop(timeout=0.2)
        self.exit()
