"""Tokens pane: the prompt and generated tokens as chips with their ids."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

from tokenviz.render.pieces import visible
from tokenviz.ui.panes.base import ScrollPane
from tokenviz.ui.selection import Selection


class TokensPane(ScrollPane):
    TITLE = "tokens"

    def draw(self, selection: Selection) -> None:
        s = selection.snapshot
        prompt_bg = self.colors.chip_prompt
        generated_bg = self.colors.chip_generated
        newest = self.colors.chip_newest
        cursor_color = self.colors.chip_cursor
        text = Text(no_wrap=False, overflow="fold")
        last = len(s.chips) - 1
        for i, chip in enumerate(s.chips):
            piece = visible(chip.text)
            if chip.is_special:
                piece = f"⟨{chip.text}⟩"
            style = Style(bgcolor=prompt_bg if chip.is_prompt else generated_bg, dim=chip.is_template)
            if i == last and not chip.is_prompt:
                style += Style(color=newest, bold=True)
            if i == selection.cursor:
                style += Style(color=cursor_color, bold=True, underline=True)
            text.append(piece, style)
            text.append(f"{chip.id}", Style(dim=True, italic=True))
            text.append(" ")
        pending = s.pending
        if pending is not None:
            d = pending.decision
            text.append(f" → next: {visible(d.chosen_text)} ({d.mode}, p={d.chosen_prob:.3f})", Style(dim=True))
        elif s.stop_reason:
            text.append(f" ■ stopped: {s.stop_reason}", Style(dim=True, bold=True))
        n_gen = len(s.chips) - s.prompt_len
        self.border_subtitle = f"{s.prompt_len} prompt · {n_gen} generated · cursor {selection.cursor}"
        self.body.update(text)
