"""Tokens pane: the prompt and generated tokens as chips with their ids, and the decoded text.

Only the lines on screen are drawn: the lines around the cursor (the newest token while following
it), laid out by ChipLines, so the pane follows the journey at any length and its cost does not
grow with it. A prompt chip and a generated chip differ in more than their background (the
generated piece is drawn in the generated colour, and a mark stands where generation begins), so
they stay apart on 256- and 16-colour terminals and without colour.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text

from tokenviz.contract.records import TokenChip
from tokenviz.contract.text import safe_text
from tokenviz.render.chip_lines import ChipLines
from tokenviz.render.pieces import visible
from tokenviz.render.units import probability
from tokenviz.ui.panes.base import BoxPane
from tokenviz.ui.selection import Selection

GENERATION_MARK = "▸ "  # between the last prompt chip and the first generated one
TEXT_LABEL = "text: "


def piece_of(chip: TokenChip) -> str:
    return f"⟨{chip.text}⟩" if chip.is_special else visible(chip.text)


class TokensPane(BoxPane):
    TITLE = "tokens"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._chips: tuple[TokenChip, ...] = ()
        self._prompt_len = 0
        self._lines = ChipLines(self._cells)
        self.show_ids = True  # the # key

    def _cells(self, index: int) -> int:
        chip = self._chips[index]
        mark = len(GENERATION_MARK) if index == self._prompt_len and index else 0
        ids = len(str(chip.id)) + 2 if self.show_ids else 0  # "piece 504  "
        return mark + cell_len(piece_of(chip)) + ids + 1

    def page_lines(self) -> int:
        return max(self.content_size.height - 3, 1)

    def moved_by_lines(self, index: int, lines: int) -> int:
        """The chip `lines` lines below (above, if negative) `index`, as near its column as there is."""
        line = self._lines.line_of(index)
        target = min(max(line + lines, 0), max(len(self._lines.starts) - 1, 0))
        here, there = self._lines.line(line), self._lines.line(target)
        return min(there.start + (index - here.start), there.stop - 1)

    def draw(self, selection: Selection) -> None:
        s = selection.snapshot
        self._chips, self._prompt_len = s.chips, s.prompt_len
        width, rows = self.content_size.width, self.content_size.height
        if width <= 0 or rows <= 0:
            return
        self._lines.update([(c.id, self.show_ids, s.prompt_len) for c in s.chips], width)
        chip_rows = max(rows - 2, 1)  # then a line of the decoded text, and one of what comes next
        cursor = selection.cursor
        count = len(self._lines.starts)
        first = max(0, min(self._lines.line_of(cursor) - chip_rows + 1, count - chip_rows))
        text = Text(no_wrap=True, overflow="ellipsis", end="")
        for number in range(first, min(first + chip_rows, count)):
            if number > first:
                text.append("\n")
            for i in self._lines.line(number):
                self._append_chip(text, i, cursor)
        if rows > 2:
            text.append("\n")
            text.append_text(self._decoded(s.full_text, width))
        text.append("\n")
        text.append_text(self._trailer(selection))
        self.update(text)
        n_gen = len(s.chips) - s.prompt_len
        lines = f" · lines {first + 1}-{min(first + chip_rows, count)} of {count}" if count > chip_rows else ""
        self.border_subtitle = f"{s.prompt_len} prompt · {n_gen} generated · cursor at position {cursor}{lines}"

    def _append_chip(self, text: Text, i: int, cursor: int) -> None:
        chip, colors = self._chips[i], self.colors
        if i == self._prompt_len and i:
            text.append(GENERATION_MARK, Style(color=colors.chip_newest, bold=True))
        if chip.is_prompt:
            style = Style(bgcolor=colors.chip_prompt, dim=chip.is_template)
        else:
            style = Style(bgcolor=colors.chip_generated, color=colors.chip_newest, dim=chip.is_template)
        if i == len(self._chips) - 1 and not chip.is_prompt:
            style += Style(bold=True)
        if i == cursor:
            style += Style(color=colors.chip_cursor, bold=True, underline=True)
        text.append(piece_of(chip), style)
        if self.show_ids:
            text.append(f" {chip.id}", Style(dim=True, italic=True))
            text.append(" ")
        text.append(" ")

    @staticmethod
    def _decoded(full_text: str, width: int) -> Text:
        """The journey's decoded text as one plain line: its end, as much as fits."""
        room = max(width - len(TEXT_LABEL) - 1, 1)
        tail = full_text[-4 * room :]  # enough for the line; the rest is never looked at
        flat = safe_text(tail.replace("\n", "↵").replace("\t", " "))
        shown = flat if cell_len(flat) <= room and len(tail) == len(full_text) else "…" + flat[-(room - 1) :]
        return Text.assemble((TEXT_LABEL, "dim"), shown)

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
