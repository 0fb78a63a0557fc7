"""Sampling pane: each stage in order, the distribution before and after, the draw, the decision."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual import work
from textual.message import Message

from tokenviz.contract.commands import Adjust, Assign, Constrain, Play, Start
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.presets import assigned, preset_in_force
from tokenviz.contract.records import PRESENCE_FREQUENCY, REPETITION, Decision, ModelInfo, Stage
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.snapshot import ComparisonSnapshot
from tokenviz.contract.worker import Worker
from tokenviz.render.bars import bar
from tokenviz.render.columns import cell
from tokenviz.render.units import draw_digits, probability
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import BoxPane
from tokenviz.ui.screens import CompareDialog, GrammarDialog, SettingsDialog
from tokenviz.ui.selection import Selection

SHORT_NAMES = {"temperature": "temp", "repetition": "repeat"}  # a stage's column (7 cells), by its name


def short_name(stage: Stage, settings: SamplingSettings) -> str:
    """A stage's name in a word or two, the penalty by the one it applies ("freq", "pres", "pres+freq")."""
    if stage.name == PRESENCE_FREQUENCY:
        named = [w for w, on in (("pres", settings.presence_penalty), ("freq", settings.frequency_penalty)) if on]
        return "+".join(named) or "penalty"
    return SHORT_NAMES.get(stage.name, stage.name)


def short_stage(stage: Stage, settings: SamplingSettings) -> str:
    """A stage named and set in words, as a short line gives it: "temp 0.7", "top-p 0.95", "freq 0.3"."""
    s = settings
    values = {
        "temperature": f"{s.temperature:g}",
        "top-k": f"{s.top_k}",
        "top-p": f"{s.top_p:g}",
        "min-p": f"{s.min_p:g}",
        REPETITION: f"×{s.repetition_penalty:g}",
    }
    if stage.name == PRESENCE_FREQUENCY:
        parts = (("pres", s.presence_penalty), ("freq", s.frequency_penalty))
        return " ".join(f"{word} {value:g}" for word, value in parts if value)
    if stage.name in values:
        return f"{short_name(stage, s)} {values[stage.name]}"
    return stage.detail  # a grammar's label names it


def settings_lines(settings: SamplingSettings) -> tuple[str, str]:
    """Every setting; and, for a narrow border, only those in force and the seed."""
    s = settings
    parts = [  # (text, whether it changes anything)
        ("greedy (T=0)" if s.greedy else f"T {s.temperature:.2f}", True),
        (f"top-k {s.top_k or 'off'}", bool(s.top_k)),
        (f"top-p {s.top_p:.2f}" if s.top_p < 1 else "top-p off", s.top_p < 1),
        (f"min-p {s.min_p:.2f}" if s.min_p else "min-p off", bool(s.min_p)),
        (f"rep {s.repetition_penalty:g}", s.repetition_penalty != 1),
        (f"pres {s.presence_penalty:g}", bool(s.presence_penalty)),
        (f"freq {s.frequency_penalty:g}", bool(s.frequency_penalty)),
        (f"seed {s.seed}", True),
        *([(f"grammar {s.grammar.label}", True)] if s.grammar is not None else []),
        *([(f"preset {preset.name}", True)] if (preset := preset_in_force(s)) else []),
    ]
    return " · ".join(t for t, _ in parts), " · ".join(t for t, in_force in parts if in_force)


def subtitle_lines(decided: SamplingSettings, now: SamplingSettings) -> tuple[str, str]:
    """The pane's subtitle (whole, and for a narrow border): the settings in force, said to be the ones
    from now on where the step shown was decided with others (a past step's, before F3: never read as
    the settings that made it)."""
    full, short = settings_lines(now)
    return (full, short) if decided == now else (f"now: {full}", f"now: {short}")


def decision_line(d: Decision, width: int | None = None) -> str:
    """The decision in words; in `width` cells, a shorter form that keeps every number."""
    token = visible(d.chosen_text)
    if d.mode == "greedy":
        return f"greedy: argmax → {token} (raw p {probability(d.raw_prob)})"
    if d.mode == "drawn":
        over, briefly = "", ""
        if d.stages and d.chosen_prob > 0:
            over = "; final p over its top-N " + probability(d.chosen_prob)
            briefly = " · final p over top-N " + probability(d.chosen_prob)
        elif d.stages:  # the stages recomputed here over the top N cannot account for it: never "p 0"
            over = "; past what the stages recomputed here over its top-N keep: the server's see its whole vocabulary"
            briefly = " · past what the stages here keep"
        full = f"the server drew {token} (its rank {d.raw_rank}, p {probability(d.raw_prob)}{over})"
        short = f"server drew {token} · #{d.raw_rank} p {probability(d.raw_prob)}{briefly}"
        return full if width is None or cell_len(full) <= width else short
    if d.mode == "forced":
        full = (
            f"forced (a branch): {token} (raw rank {d.raw_rank}, raw p {probability(d.raw_prob)}; "
            f"final p {probability(d.chosen_prob)})"
        )
        short = (
            f"forced: {token} · raw #{d.raw_rank} p {probability(d.raw_prob)} · final p {probability(d.chosen_prob)}"
        )
        return full if width is None or cell_len(full) <= width else short
    assert d.band is not None  # a sampled decision has its band
    low, high = d.band
    n = draw_digits(low, high)  # enough to show an interval: a band of 6e-05 at 0.9993 needs 5
    full = (
        f"draw u = {d.u:.{n}f} fell in [{low:.{n}f}, {high:.{n}f}) → sampled {token} "
        f"(final rank {d.chosen_rank}, final p {probability(d.chosen_prob)}; raw rank {d.raw_rank})"
    )
    short = (
        f"u {d.u:.{n}f} ∈ [{low:.{n}f}, {high:.{n}f}) → {token} · final #{d.chosen_rank} p {probability(d.chosen_prob)}"
        f" · raw #{d.raw_rank}"
    )
    return full if width is None or cell_len(full) <= width else short


def pinned_rows(d: Decision, rows: int) -> list[int]:
    """The watched tokens' indices to show, strongest raw first, in `rows` rows: the chosen token's
    row kept last where it ranks below them (a grammar's choice, below the candidates it forbade)."""
    ordered = sorted(range(len(d.watch)), key=lambda i: -d.raw_probs[i])
    chosen = next((i for i in ordered if d.watch[i][0] == d.chosen_id), None)
    if chosen is None or chosen in ordered[:rows]:
        return ordered[:rows]
    return [*ordered[: rows - 1], chosen]


def pipeline_text(d: Decision, info: ModelInfo, compact: bool = False) -> Text:
    """The stages in order, each with what it kept: `logits → softmax → temperature T=0.7: 300 kept
    (100.0% of mass) → … → draw`; `compact`, one short line: `softmax → T=0.7: 300 → k=8: 8 → draw`. Over
    a top N (info.covers), it says whose."""
    n = info.covers
    given = f"{info.giver}'s top {n}" + (" (raw)" if d.stages else "")
    start = (f"top {n}" if compact else given) if n else ("softmax" if compact else "logits → softmax")
    pipeline = Text(start, style="bold")
    if n and d.stages and not compact:
        pipeline.append(" · the stages recomputed here over those only", style="dim")
    for st in d.stages:
        words = short_stage(st, d.settings) if compact else f"{st.name} {st.detail}"
        pipeline.append(f" → {words}: ", style="bold")
        if st.is_penalty:  # it keeps every token: what it did is the tokens it penalised (↓ below)
            pipeline.append(f"{st.changed} lowered" if compact else f"{st.changed} tokens penalised ↓")
        elif st.is_grammar:  # what it forbade is struck through below
            allowed = "forced: the only token allowed" if st.kept == 1 else f"{st.kept:,} allowed"
            pipeline.append(allowed if compact else f"{allowed}, {st.removed:.1%} of the mass removed")
        else:
            pipeline.append(f"{st.kept}" if compact else f"{st.kept} kept ({st.mass:.1%} of mass)")
    pipeline.append(" → ", style="bold")
    last = {"greedy": "argmax", "forced": "forced", "drawn": "the server's draw"}.get(d.mode, "draw")
    pipeline.append(last, style="bold")
    return pipeline


class SamplingPane(BoxPane):
    TITLE = "sampling"

    class CompareAsked(Message):
        """The comparison the user asked for, its worker made: the screen opens it (a pane opens no screen)."""

        def __init__(self, worker: Worker[ComparisonSnapshot]) -> None:
            super().__init__()
            self.worker = worker

    # ---- its keys (routed here by the journey's screen: see ui.keys.Press.owner) ----------------------

    def action_adjust(self, name: str, direction: int) -> None:
        self.journey.submit(Adjust(name=name, direction=direction))

    def action_assign(self) -> None:
        """Type any setting (see Assign): checked here against the settings in view, so a mistake is one
        line and nothing changes."""
        journey = self.journey
        s = journey.snapshot

        def wrong(line: str) -> str | None:
            if s is None:
                return None
            try:
                assigned(s.settings, tuple(line.split()))
            except TokenvizError as exc:
                return str(exc)
            return None

        def chosen(line: str | None) -> None:
            if line and s is not None:
                journey.submit(Assign(tuple(line.split())))

        self.app.push_screen(SettingsDialog(check=wrong), chosen)

    def action_grammar(self) -> None:
        """Set, change or clear the grammar (see Constrain): the file is read and checked off the UI's
        thread (read_grammar), so nothing it turns out to be can hold the app."""

        def chosen(line: str | None) -> None:
            if line is not None:
                self.read_grammar(line)

        s = self.journey.snapshot
        self.app.push_screen(GrammarDialog(s.settings.grammar if s else None), chosen)

    @work(thread=True, group="grammar")
    def read_grammar(self, line: str) -> None:
        from tokenviz.files.grammar_file import grammar_from_line  # the engine's import waits until asked

        try:
            grammar = grammar_from_line(line)
        except TokenvizError as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error")
            return
        self.app.call_from_thread(self.journey.submit, Constrain(grammar=grammar))

    def action_compare(self) -> None:
        """Compare this journey's settings with others, side by side, on this model (the palette's)."""
        journey = self.journey
        s = journey.snapshot
        if s is None or s.info is None:
            self.notify("the model has not loaded yet", severity="warning")
            return

        def chosen(text: str | None) -> None:
            if not text:
                return
            try:
                against = assigned(s.settings, text.split())
                worker = journey.worker.compare(s.settings, against, Start(s.prompt, s.chat, s.system))
            except TokenvizError as exc:
                self.notify(str(exc), severity="error")
                return
            journey.submit(Play(on=False))
            self.post_message(self.CompareAsked(worker))

        self.app.push_screen(CompareDialog(), chosen)

    def draw(self, selection: Selection) -> None:
        record = selection.record
        settings = selection.snapshot.settings
        if record is None:
            self.set_subtitle(*settings_lines(settings))
            self.update(Text("No decision at this position: the prompt's tokens were given, not sampled.", style="dim"))
            return
        d = record.decision
        chosen_color = self.theme_colors.chosen
        bar_color = self.theme_colors.bar
        final_color = self.theme_colors.bar_final

        width = max(self.size.width, 1)
        decision = Text(decision_line(d, width), style=f"bold {chosen_color}")
        decision_rows = len(decision.wrap(self.app.console, width))
        kept = sum(p > 0 for p in d.final_probs)  # the watched tokens the draw could still take
        for compact in (False, True):  # a short pane gives the pipeline one line, for the kept tokens' rows
            pipeline = pipeline_text(d, selection.info, compact)
            pipeline_rows = len(pipeline.wrap(self.app.console, width))
            rows = max(self.size.height - pipeline_rows - decision_rows - 1, 1)
            if rows >= kept:
                break
        stage_w = 7
        fixed = 1 + 13 + 8 + 1 + len(d.stages) * (stage_w + 1)
        bar_width = min(48, max((self.size.width - fixed) // 2, 2))  # wide terminals get longer bars
        table = Text(no_wrap=True, overflow="crop")
        table.append(f" {cell('token', 13)} {'raw':>6} {cell('', bar_width)} ", style="bold")
        for st in d.stages:
            table.append(cell(short_name(st, d.settings), stage_w, right=True) + " ", style="bold")
        table.append("final\n", style="bold")
        watched = pinned_rows(d, rows)
        finals = d.final_probs
        grammar = next((st for st in d.stages if st.is_grammar), None)
        for i in watched:
            token_id, piece = d.watch[i]
            mark = token_id == d.chosen_id
            forbidden = grammar is not None and grammar.probs[i] == 0
            style = f"bold {chosen_color}" if mark else "strike dim" if forbidden else ""
            table.append(("▶" if mark else "✗" if forbidden else " ") + cell(visible(piece), 13), style=style)
            table.append(f" {probability(d.raw_probs[i], 6)} ")
            table.append(bar(d.raw_probs[i], bar_width) + " ", style=bar_color)
            for st in d.stages:
                value = probability(st.probs[i]) if st.probs[i] > 0 else "—"
                penalised = st.is_penalty and i < len(st.changed_watched) and st.changed_watched[i]
                table.append(cell(value + ("↓" if penalised else ""), stage_w, right=True) + " ")
            table.append(bar(finals[i], bar_width) + "\n", style=final_color)
        table.rstrip()
        self.set_subtitle(*subtitle_lines(d.settings, settings))
        self.update(Text("\n").join([pipeline, table, decision]))
