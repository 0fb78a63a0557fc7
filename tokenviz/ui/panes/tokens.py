"""Tokens pane: the prompt and generated tokens as chips with their ids.

Only the lines on screen are drawn: the lines around the cursor (the newest token while following
it), laid out by ChipLines, so the pane follows the journey at any length and its cost does not
grow with it.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text

from tokenviz.contract.records import TokenChip
from tokenviz.render.chip_lines import ChipLines
from tokenviz.render.pieces import visible
from tokenviz.render.units import probability
from tokenviz.ui.panes.base import BoxPane
from tokenviz.ui.selection import Selection


def piece_of(chip: TokenChip) -> str:
    return f"⟨{chip.text}⟩" if chip.is_special else visible(chip.text)


class TokensPane(BoxPane):
    TITLE = "tokens"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._chips: tuple[TokenChip, ...] = ()
        self._lines = ChipLines(self._cells)

    def _cells(self, index: int) -> int:
        chip = self._chips[index]
        return cell_len(piece_of(chip)) + len(str(chip.id)) + 1

    def draw(self, selection: Selection) -> None:
        s = selection.snapshot
        self._chips = s.chips
        width, rows = self.content_size.width, self.content_size.height
        if width <= 0 or rows <= 0:
            return
        self._lines.update([c.id for c in s.chips], width)
        chip_rows = max(rows - 1, 1)  # the last row says what comes next
        cursor = selection.cursor
        count = len(self._lines.starts)
        first = max(0, min(self._lines.line_of(cursor) - chip_rows + 1, count - chip_rows))
        text = Text(no_wrap=True, overflow="ellipsis", end="")
        for number in range(first, min(first + chip_rows, count)):
            if number > first:
                text.append("\n")
            for i in self._lines.line(number):
                self._append_chip(text, i, cursor)
        text.append("\n")
        text.append_text(self._trailer(selection))
        self.update(text)
        n_gen = len(s.chips) - s.prompt_len
        lines = f" · lines {first + 1}-{min(first + chip_rows, count)} of {count}" if count > chip_rows else ""
        self.border_subtitle = f"{s.prompt_len} prompt · {n_gen} generated · cursor {cursor}{lines}"

    def _append_chip(self, text: Text, i: int, cursor: int) -> None:
        chip, colors = self._chips[i], self.colors
        style = Style(bgcolor=colors.chip_prompt if chip.is_prompt else colors.chip_generated, dim=chip.is_template)
        if i == len(self._chips) - 1 and not chip.is_prompt:
            style += Style(color=colors.chip_newest, bold=True)
        if i == cursor:
            style += Style(color=colors.chip_cursor, bold=True, underline=True)
        text.append(piece_of(chip), style)
        text.append(f"{chip.id}", Style(dim=True, italic=True))
        text.append(" ")

    @staticmethod
    def _trailer(selection: Selection) -> Text:
        s = selection.snapshot
        pending = s.pending
        if pending is not None:
            d = pending.decision
            return Text(
                f"→ next: {visible(d.chosen_text)} ({d.mode}, final p {probability(d.chosen_prob)})", Style(dim=True)
            )
        if s.stop_reason:
            return Text(f"■ stopped: {s.stop_reason}", Style(dim=True, bold=True))
        return Text("")
