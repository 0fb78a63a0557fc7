"""The comparison's screen: two journeys on one prompt side by side, stepped together, and how they
differ (`tokenviz compare`, or from the app's palette on the journey's model).

Each side shows its tokens and its next-token candidates (the journey's panes, drawn from that
side's Snapshot); below, the steps in llama-perplexity's terms (B the base), a chart of each step's KL
with ▲ where the top-1s differ (p and P move the cursor to them), and every step's KL divergence, Δp,
whether the two top-1 agree and the rank each gives the other's choice. The first token where the paths
part is marked in both token strips.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from tokenviz.contract.commands import Command, Save
from tokenviz.contract.interventions import briefly
from tokenviz.contract.results import StepDiff
from tokenviz.contract.snapshot import ComparisonSnapshot, Snapshot
from tokenviz.files.documents import interventions_in_force, setup, setup_differences
from tokenviz.render.columns import cell
from tokenviz.render.perplexity_figures import perplexity_figures
from tokenviz.render.sparkline import sparkline
from tokenviz.render.visible import visible
from tokenviz.ui.fitting_footer import FittingFooter
from tokenviz.ui.keys import COMPARE_KEYS, COMPARE_PALETTE_ONLY, bindings
from tokenviz.ui.panes.base import BoxPane
from tokenviz.ui.panes.next_token import NextTokenPane
from tokenviz.ui.panes.tokens import TokensPane
from tokenviz.ui.screens import COMPARE_HELP
from tokenviz.ui.selection import Selection
from tokenviz.ui.worker_screen import WorkerScreen

SIDES = ("a", "b")
HEADER_LINES = 4  # the most lines a side's header takes (its label's max-height)
INFINITE_KL = "∞: B's stages rule out a token A's keep (p 0 in B): KL(A ‖ B) is infinite\n"  # fits 80 columns
SEPARATE_DRAWS = "sampled: each side draws on its own (the server with its generator): a parting is two draws\n"


def describe(s: Snapshot, other: Snapshot | None, width: int = 10**6) -> Text:
    """A side's header, within `width` cells a line: every field where it differs from the other side
    first, marked (≠), each whole however many lines they take (the label wraps), then the interventions
    both run under (the model is not itself: briefly, where they would not fit whole), then the rest of
    what it runs on and by, dim, while it fits the line. Whole fields only: where the rest does not fit,
    it ends in "…"."""
    fields = setup(s)
    differing = setup_differences(s, other) if other is not None else {}
    rest = {name: value for name, value in fields.items() if name not in differing}
    under = rest.pop("interventions") if rest.get("interventions", "none") != "none" else None
    parts = [(f"≠ {name} {fields[name]}", Style(bold=True)) for name in differing]
    if under is not None:
        room = width - sum(cell_len(words) + 3 for words, _ in parts) - 4  # 4: " · …" after it
        whole = f"interventions {under}"
        brief = f"interventions {briefly(interventions_in_force(s))}"
        parts.append((whole if cell_len(whole) <= room else brief, Style(bold=True)))
    parts += [(f"{name} {value}", Style(dim=True)) for name, value in rest.items()]
    named = max(len(differing), 1)  # every difference, and at least one field: a header says that
    shown, used = named, sum(cell_len(words) + 3 for words, _ in parts[:named]) - 3
    if used > width:  # the differences wrap: the rest would only push them further
        width = used
    while shown < len(parts):
        more = cell_len(parts[shown][0]) + 3 + (4 if shown + 1 < len(parts) else 0)
        if used + more > width:
            break
        used += cell_len(parts[shown][0]) + 3
        shown += 1
    text = Text(" · ").join(Text(words, style) for words, style in parts[:shown])
    if shown < len(parts):
        text.append(" · …", Style(dim=True))
    return text


class DiffPane(BoxPane):
    TITLE = "how they differ"

    def show_comparison(self, c: ComparisonSnapshot, cursor_step: int | None) -> None:
        width = max(self.size.width - 2, 30)
        text = Text(no_wrap=True, overflow="ellipsis")  # a line too long for the pane ends in …
        text.append(statistics_lines(c.statistics, len(c.diffs), width), Style(bold=True))
        if c.kl_over or any(d.kl > 0 for d in c.diffs):  # two models: theirs (a served B's over its top N)
            kl = [d.kl for d in c.diffs]
            label = "KL top-N, bits" if c.kl_over else "KL raw, bits"
        else:  # one model, two settings: what the settings change
            kl = [d.final_kl if math.isfinite(d.final_kl) else 0.0 for d in c.diffs]
            label = "KL final, bits"
        room = max(width - CHART_LABEL - 1, 8)
        text.append(f"{label:<{CHART_LABEL}} ", Style(dim=True))
        text.append(sparkline(kl, room) + "\n", Style(color=self.theme_colors.bar))
        text.append(f"{'top-1s differ':<{CHART_LABEL}} ", Style(dim=True))
        text.append(differ_marks(c.diffs, room) + "\n", Style(bold=True, color=self.theme_colors.bar_final))
        if c.kl_over:
            text.append(f"KL over {c.kl_over}; what the server draws from is not here (—)\n", Style(dim=True))
        if c.parted_at is not None and c.independent_draws:
            text.append(SEPARATE_DRAWS, Style(dim=True))
        if not c.diffs:  # (loading, or the prompt not read yet: nothing has been chosen)
            text.append("no step yet\n", Style(dim=True))
        elif c.parted_at is None:
            text.append("the paths have not parted: both chose the same token at every step\n")
        elif c.a and c.b:
            a, b = c.a.records[c.parted_at].decision, c.b.records[c.parted_at].decision
            text.append(
                f"▼ the paths part at step {c.parted_at}: ", Style(bold=True, color=self.theme_colors.bar_final)
            )
            text.append(
                f"A took {visible(a.chosen_text)}, B took {visible(b.chosen_text)}; after it, B's figures (†) "
                "are B's on A's path, so each row compares one context\n"
            )
        text.append(
            f"{'step':>5} {'KL top-N' if c.kl_over else 'KL raw':>8} {'KL final':>9} {'top-1':>6} {'Δp':>7} "
            f"{'A ranks B':>10} {'B ranks A':>10}\n",
            Style(bold=True),
        )
        rows = max(self.size.height - text.plain.count("\n") - 1, 1)  # (1: the line that may explain an ∞)
        shown = [d for d in c.diffs if cursor_step is None or d.index <= cursor_step][-rows:]
        for d in shown:
            style = Style(bold=True) if d.index == cursor_step else Style()
            agree = "same" if d.top1_agree else "differ"
            final = f"{d.final_kl:.4f}" if math.isfinite(d.final_kl) else "—" if math.isnan(d.final_kl) else "∞"
            dp = f"{d.dp:+.1%}" if math.isfinite(d.dp) else "—"
            mark = "†" if d.teacher_forced else " "
            text.append(
                f"{d.index:>4}{mark} {d.kl:>8.4f} {final:>9} {cell(agree, 6, right=True)} {dp:>7} "
                f"{d.a_rank_of_b:>10} {d.b_rank_of_a:>10}\n",
                style,
            )
        if any(math.isinf(d.final_kl) for d in shown):  # ∞ is a fact, not a failure: say which
            text.append(INFINITE_KL, Style(dim=True))
        text.rstrip()
        self.update(text)
        self.set_subtitle(f"{c.state}{' · ' + c.message if c.message else ''}")


CHART_LABEL = 15  # cells of the charts' labels, so their columns line up: one column a step


def statistics_lines(statistics: Mapping[str, Any] | None, steps: int, width: int) -> str:
    """The journey in llama-perplexity's terms, B the base (journey.comparison.journey_statistics): its
    mean KLD in nats, how often the top-1s agree, the RMS of Δp and the perplexity ratio; on one line
    where it fits `width`, else the figures on a line of their own."""
    if statistics is None:
        return "as llama-perplexity, B the base: no step scored yet\n"
    figures = perplexity_figures(statistics)
    said = f"{statistics['count']} of {steps} steps, B the base:"
    return f"{said} {figures}\n" if cell_len(said) + 1 + cell_len(figures) <= width else f"{said}\n{figures}\n"


def differ_marks(diffs: Sequence[StepDiff], width: int) -> str:
    """Under the KL chart, one column a step: ▲ where the two top-1s differ."""
    return "".join(" " if d.top1_agree else "▲" for d in diffs[-width:]).rstrip()


def next_parting(diffs: Sequence[StepDiff], step: int | None, forward: bool) -> int | None:
    """The step after `step` (before it, not `forward`) where the two top-1s differ; None if none. From
    no step (`step` None), forward is from the start and back from the end."""
    differ = [d.index for d in diffs if not d.top1_agree]
    if forward:
        return next((i for i in differ if step is None or i > step), None)
    return next((i for i in reversed(differ) if step is None or i < step), None)


class CompareScreen(WorkerScreen[ComparisonSnapshot]):
    KEY_ROWS = COMPARE_KEYS
    PALETTE_ONLY = COMPARE_PALETTE_ONLY
    BINDINGS: ClassVar = bindings(COMPARE_KEYS)
    HELP = COMPARE_HELP
    EXPORT_NAME = "tokenviz-compare"
    EXPORT_SUFFIXES = ("-a.json", "-b.json", ".json")
    DEFAULT_CSS = f"""
    CompareScreen #sides {{ height: 1fr; }}
    CompareScreen #sides > Vertical {{ width: 1fr; }}
    CompareScreen .label {{
        height: auto; max-height: {HEADER_LINES}; padding: 0 1; color: $primary; text-style: bold;
    }}
    CompareScreen TokensPane {{ height: 1fr; }}
    CompareScreen NextTokenPane {{ height: 1fr; width: 100%; }}
    CompareScreen DiffPane {{ height: 12; }}
    """

    def compose(self) -> ComposeResult:
        with Horizontal(id="sides"):
            for side in SIDES:
                with Vertical(id=f"side-{side}"):
                    yield Static(f"{side.upper()}: loading…", id=f"label-{side}", classes="label")
                    yield TokensPane(id=f"tokens-{side}")
                    yield NextTokenPane(final_column=True, id=f"next-{side}")
        yield DiffPane()
        yield FittingFooter()

    def draw(self, before: ComparisonSnapshot | None, c: ComparisonSnapshot) -> None:
        if c.state == "error" and c.a is None:
            self.fatal_error = c.error
        self.refresh_panes()

    def refresh_panes(self) -> None:
        c = self.snapshot
        if c is None:
            return
        cursor_step = None
        lines: list[int] = []
        for side, s in zip(SIDES, (c.a, c.b)):
            if s is None or not s.records or s.info is None:
                continue
            positions = s.prompt_len + len(s.records) - 1
            cursor = positions - 1 if self.cursor is None else min(self.cursor, positions - 1)
            selection = Selection(snapshot=s, info=s.info, layer=0, head="mean", cursor=cursor)
            other = c.b if side == "a" else c.a
            label = self.query_one(f"#label-{side}", Static)
            width = label.content_size.width - 3 if label.content_size.width else 10**6  # 3: "A: "
            header = Text(f"{side.upper()}: ").append_text(describe(s, other, width))
            label.update(header)
            lines.append(len(header.wrap(self.app.console, width + 3)) if width < 10**6 else 1)
            tokens = self.query_one(f"#tokens-{side}", TokensPane)
            tokens.marked = None if c.parted_at is None else s.prompt_len + c.parted_at
            tokens.show(selection)
            self.query_one(f"#next-{side}", NextTokenPane).show(selection)
            cursor_step = cursor - s.prompt_len + 1
        if lines:  # both headers as tall as the taller, so the two sides' panes begin on one row
            for side in SIDES:
                self.query_one(f"#label-{side}", Static).styles.height = min(max(lines), HEADER_LINES)
        self.query_one(DiffPane).show_comparison(c, cursor_step)

    def watch_cursor(self) -> None:
        self.refresh_panes()

    def exportable(self) -> bool:
        return self.snapshot is not None and self.snapshot.a is not None

    def export_request(self, stem: str) -> Command:
        return Save(path=stem)

    def action_cursor(self, delta: int) -> None:
        c = self.snapshot
        if c is None or c.a is None or not c.a.records:
            return
        positions = min(s.prompt_len + len(s.records) - 1 for s in (c.a, c.b) if s is not None)
        current = positions - 1 if self.cursor is None else self.cursor
        self.cursor = min(max(current + delta, 0), positions - 1)

    def action_cursor_end(self, first: bool) -> None:
        """The cursor to the first step (the last prompt token), or back to the newest."""
        c = self.snapshot
        if c is None or c.a is None or not c.a.records:
            return
        self.cursor = c.a.prompt_len - 1 if first else None

    def action_parting(self, forward: bool) -> None:
        """The cursor to the next (or the previous) step where the two top-1s differ."""
        c = self.snapshot
        if c is None or c.a is None or not c.a.records:
            return
        prompt_len = c.a.prompt_len
        step = None if self.cursor is None else self.cursor - prompt_len + 1
        if step is None and not forward:
            step = len(c.diffs)
        found = next_parting(c.diffs, step, forward)
        if found is None:
            where = "after" if forward else "before"
            self.notify(f"the top-1s do not differ {where} step {step if step is not None else 0}")
            return
        self.cursor = prompt_len + found - 1

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Escape's "back" is in the footer only where there is a journey to go back to."""
        return action != "back" or len(self.app.screen_stack) > 1

    def action_back(self) -> None:
        """Back to the journey this comparison was opened from (none: `tokenviz compare` alone)."""
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()
        else:
            self.notify("this comparison is the whole app: q quits", severity="information")
