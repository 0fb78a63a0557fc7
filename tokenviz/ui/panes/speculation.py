"""Speculative decoding pane: each round's drafts, what the target accepted, what replaced the rest."""

from __future__ import annotations

from rich.text import Text

from tokenviz.contract.commands import DEFAULT_DRAFTER, Speculate
from tokenviz.render.columns import fitting
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import Run, ScrollPane, asked_result
from tokenviz.ui.selection import Selection

STEPS = 16  # tokens a run decodes


class SpeculationPane(ScrollPane):
    TITLE = "speculative decoding"

    def action_speculate(self, drafter: str | None = None) -> None:
        """Speculative decoding from the current tokens, with the current settings, by the engine's default
        drafter (DEFAULT_DRAFTER: early exit at the middle layer where the runtime can draft so, which drafts
        on any text; else prompt lookup). The key pressed again, with the run shown, returns to attention."""
        journey = self.journey
        if drafter is None and journey.showing("speculation", Speculate):
            journey.open_view("attention")
            return
        journey.submit(Speculate(drafter=drafter or DEFAULT_DRAFTER, steps=STEPS))
        journey.open_view("speculation")

    def draw(self, selection: Selection) -> None:
        body = self.body
        spec = asked_result(selection, Run(Speculate, "speculate"), body, "drafting and verifying…", "speculation")
        if spec is None:
            return
        width = body.size.width - 3 if body.size.width else 10**6  # the scrollbar
        pieces, ok = spec.texts, self.theme_colors.chosen
        text = Text(no_wrap=True, overflow="crop")
        summary = (
            f"drafter: {spec.drafter} · {len(spec.rounds)} target forwards for {len(spec.ids)} tokens "
            f"({spec.tokens_per_forward:.2f} per forward) · acceptance {spec.acceptance_rate:.0%} of "
            f"{spec.drafted} drafted",
            f"{spec.drafter} · {len(spec.rounds)} forwards, {len(spec.ids)} tokens · "
            f"{spec.acceptance_rate:.0%} of {spec.drafted} accepted",
            # narrower: every figure whole, the drafter dropped; the title and the legend say what it is
            f"{len(spec.rounds)} forwards, {len(spec.ids)} tokens · "
            f"{spec.acceptance_rate:.0%} of {spec.drafted} accepted",
            f"{len(spec.rounds)} fwd, {len(spec.ids)} tok · {spec.acceptance_rate:.0%} accepted",
        )
        legend = (
            "each round: drafts ✓ accepted / ✗ rejected, then → the target's own token "
            "(a replacement, or a bonus when every draft passed)",
            "✓ accepted ✗ rejected → the target's own token",
        )
        text.append(fitting(summary, width) + "\n", style="bold")
        text.append(fitting(legend, width) + "\n", style="dim")
        for i, r in enumerate(spec.rounds, 1):
            text.append(f"round {i:>2}: ", style="bold")
            if not r.drafted:
                text.append("(no draft) ", style="dim")  # (not "·": a space token reads so)
            for k, token in enumerate(r.drafted):
                if k < r.accepted:
                    text.append(f"{visible(pieces[token])}✓ ", style=ok)
                elif k == r.rejected_at:
                    text.append(f"{visible(pieces[token])}✗ ", style="bold red")
                else:
                    text.append(f"{visible(pieces[token])} ", style="dim strike")
            text.append(f"→ {visible(pieces[r.next_id])}\n", style="bold")
        text.append("output: ", style="bold")
        text.append(visible("".join(pieces[t] for t in spec.ids)))
        body.update(text)
