"""Beam search pane: every beam's candidates per step, which survive and which are pruned."""

from __future__ import annotations

from rich.text import Text

from tokenviz.contract.commands import Beams
from tokenviz.render.columns import fitting
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import Run, ScrollPane, asked_result
from tokenviz.ui.selection import Selection

MARKS = {"kept": "✓", "finished": "★", "at length limit": "⊣", "pruned": "✗"}
TEXT_TAIL = 24  # characters of each running beam's text shown under its step


WIDTH = 3  # the B key's width; the palette offers 2-8
STEPS = 10


class BeamPane(ScrollPane):
    TITLE = "beam search"

    width = WIDTH  # the last width run

    def action_beams(self, width: int | None = None) -> None:
        """Beam search from the current tokens (the last width, or the width chosen in the palette). The
        key pressed again, with the beams shown, returns to attention."""
        journey = self.journey
        if width is None and journey.showing("beams", Beams):
            journey.open_view("attention")
            return
        self.width = width or self.width
        journey.submit(Beams(width=self.width, steps=STEPS))
        journey.open_view("beams")

    def draw(self, selection: Selection) -> None:
        result = asked_result(
            selection, Run(Beams, "beams"), self.body, "running a beam search from here…", "beam search"
        )
        if result is None:
            return
        chosen = self.theme_colors.chosen
        text = Text(no_wrap=True, overflow="crop")
        legend = (
            f"width {result.width}: each step keeps the {2 * result.width} best continuations of all beams "
            f"by summed log-probability; ✓ survives, ★ finished (end of text), ⊣ stopped at the length limit, "
            "✗ pruned",
            f"width {result.width} · best {2 * result.width} by summed log p · ✓ kept ★ end ⊣ limit ✗ pruned",
            f"width {result.width} · ✓ kept ★ end ⊣ limit ✗ pruned",
        )
        width = self.body.size.width - 3 if self.body.size.width else 10**6  # the scrollbar
        text.append(fitting(legend, width) + "\n", style="bold")
        for step in result.steps:
            beams = " · ".join(f"b{i + 1} “{_tail(t)}”" for i, t in enumerate(step.texts))
            if beams:
                text.append(f"        {beams}\n", style="dim")
            text.append(f"step {step.index + 1:>2} ", style="bold")
            for c in step.candidates:
                style = {"kept": "", "finished": f"bold {chosen}", "at length limit": "", "pruned": "dim strike"}
                text.append(f"b{c.beam + 1}+{visible(c.text)} {c.score:.2f}{MARKS[c.fate]}  ", style=style[c.fate])
            text.append("\n")
        text.append("final, best first (score = log-prob / length):\n", style="bold")
        for rank, h in enumerate(result.final, 1):
            ending = "★ end of text" if h.end_of_text else "⊣ length limit"
            text.append(
                f"{rank}. {visible(h.text)}  log-prob {h.logprob:.3f} · score {h.score:.4f} · {ending}\n",
                style=f"bold {chosen}" if rank == 1 else "",
            )
        text.rstrip()
        self.body.update(text)


def _tail(text: str) -> str:
    shown = visible(text)
    return shown if len(shown) <= TEXT_TAIL else "…" + shown[-TEXT_TAIL:]
