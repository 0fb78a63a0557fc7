"""Tokens pane: the prompt and generated tokens as chips with their ids, and the decoded text.

Only the lines on screen are drawn: the lines around the cursor (the newest token while following
it), laid out by ChipLines, so the pane follows the journey at any length and its cost does not
grow with it. A prompt chip and a generated chip differ in more than their background (the
generated piece is drawn in the generated colour, and a mark stands where generation begins), so
they stay apart on 256- and 16-colour terminals and without colour.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text

from tokenviz.contract.commands import Continue, Start
from tokenviz.contract.records import TokenChip
from tokenviz.contract.results import Attribution
from tokenviz.contract.snapshot import Snapshot
from tokenviz.contract.text import safe_text
from tokenviz.render.chip_lines import ChipLines
from tokenviz.render.colors import legible_on, ramp
from tokenviz.render.units import probability
from tokenviz.render.visible import MAX_CHAR_BYTES, spelled, visible
from tokenviz.ui.colors import ThemeColors
from tokenviz.ui.panes.base import BoxPane
from tokenviz.ui.panes.text import read_text
from tokenviz.ui.screens import ContinueScreen, PromptChoice, PromptScreen
from tokenviz.ui.selection import Selection

GENERATION_MARK = "▸ "  # between the last prompt chip and the first generated one
TEXT_LABEL = "text: "
SURPRISAL_TOP_BITS = 16.0  # the brightest shade: a token the model gave p <= 2**-16
SHADES = 16


def piece_of(chip: TokenChip) -> str:
    return f"⟨{chip.text}⟩" if chip.is_special else visible(chip.text)


class TokensPane(BoxPane):
    TITLE = "tokens"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._chips: tuple[TokenChip, ...] = ()
        self._prompt_len = 0
        self._chip_lines = ChipLines(self._cells)
        self.show_ids = True  # the # key
        self.surprisal = False  # the u key: prompt chips shaded by how unexpected each token was
        self.attribution: Attribution | None = None  # while the attribution view shows one: see shade_by
        self._attribution_top = 1.0  # its largest score, read once per attribution, not once per chip
        self.marked: int | None = None  # a position drawn reversed (compare: where two paths part)

    # ---- its keys (routed here by the journey's screen: see ui.keys.Press.owner) ----------------------

    def action_toggle_surprisal(self) -> None:
        self.surprisal = not self.surprisal
        self.journey.refresh_panes()

    def action_toggle_ids(self) -> None:
        self.show_ids = not self.show_ids
        self.journey.refresh_panes()

    def action_edit_prompt(self) -> None:
        """The prompt editor; for a model with a chat template it offers a chat message first."""
        journey = self.journey
        s = journey.snapshot
        can_chat = bool(s and s.info and s.info.chat_template)

        def submitted(choice: PromptChoice | None) -> None:
            if choice is not None:
                journey.cursor = None
                system = s.system if s and choice.chat else None
                journey.submit(Start(prompt=choice.text, chat=choice.chat, system=system))

        chat = s.chat if s and s.records else True  # a first prompt is offered as a chat message
        context = s.info.context if s and s.info else None
        editor = PromptScreen(s.prompt if s else "", can_chat, chat, count=journey.worker.count_tokens, context=context)
        self.app.push_screen(editor, submitted)

    def action_continue_with(self) -> None:
        """Force a text of the user's own through the journey, token by token (see Continue)."""
        journey = self.journey

        def chosen(text: str | None) -> None:
            if text:
                journey.cursor = None
                journey.submit(Continue(text=text))

        self.app.push_screen(ContinueScreen(), chosen)

    def _cells(self, index: int) -> int:
        chip = self._chips[index]
        mark = len(GENERATION_MARK) if index == self._prompt_len and index else 0
        ids = len(str(chip.id)) + 2 if self.show_ids else 0  # "piece 504  "
        return mark + cell_len(piece_of(chip) + self._spelled(index)) + ids + 1

    def _spelled(self, index: int) -> str:
        """`→€` after the last byte chip of a character, so the bytes read as what they spell."""
        if not self._chips[index].text.startswith("<0x"):
            return ""
        start = max(index - MAX_CHAR_BYTES + 1, 0)
        char = spelled([c.text for c in self._chips[start : index + 1]], index - start)
        return f"→{char}" if char else ""

    def page_lines(self) -> int:
        return max(self.content_size.height - 3, 1)

    def moved_by_lines(self, index: int, lines: int) -> int:
        """The chip `lines` lines below (above, if negative) `index`, as near its column as there is."""
        line = self._chip_lines.line_of(index)
        target = min(max(line + lines, 0), max(len(self._chip_lines.starts) - 1, 0))
        here, there = self._chip_lines.line(line), self._chip_lines.line(target)
        return min(there.start + (index - here.start), there.stop - 1)

    def draw(self, selection: Selection) -> None:
        s = selection.snapshot
        self._chips, self._prompt_len = s.chips, s.prompt_len
        width, rows = self.content_size.width, self.content_size.height
        if width <= 0 or rows <= 0:
            return
        self._chip_lines.update(s.chips, width, look=(self.show_ids, s.prompt_len))
        # Then a line of the decoded text, and one of what comes next: the text keeps its line at any
        # height above one (a student reads the answer there), what comes next only from four (at 80x24
        # two chip lines keep a short prompt on screen once generation starts, UX 7's finding 15; the
        # next-token and sampling panes say what comes next there).
        extra = 2 if rows >= 4 else (1 if rows >= 2 else 0)
        chip_rows = max(rows - extra, 1)
        cursor = selection.cursor
        count = len(self._chip_lines.starts)
        first = max(0, min(self._chip_lines.line_of(cursor) - chip_rows + 1, count - chip_rows))
        text = Text(no_wrap=True, overflow="ellipsis", end="")
        for number in range(first, min(first + chip_rows, count)):
            if number > first:
                text.append("\n")
            for i in self._chip_lines.line(number):
                self._append_chip(text, i, cursor)
        if extra:
            text.append("\n")
            text.append_text(self._decoded(self._text_to(s, cursor), width))
        if extra == 2:
            text.append("\n")
            text.append_text(self._trailer(selection))
        self.update(text)
        n_gen = len(s.chips) - s.prompt_len
        lines = f" · lines {first + 1}-{min(first + chip_rows, count)} of {count}" if count > chip_rows else ""
        shading = f" · shaded by surprisal, 0-{SURPRISAL_TOP_BITS:g} bits (u)" if self.surprisal else ""
        if self.attribution is not None:
            shading = f" · shaded by attribution to position {self.attribution.position + 1}"
        above = "↑ " if first else ""  # the prompt's start scrolled above: said first, where it is seen
        self.set_subtitle(
            f"{above}{s.prompt_len} prompt · {n_gen} generated · cursor at position {cursor}{lines}{shading}",
            f"{above}{s.prompt_len} prompt · {n_gen} generated · cursor {cursor}{shading}",
            f"{above}{s.prompt_len} + {n_gen} tokens · cursor {cursor}",
        )

    def _append_chip(self, text: Text, i: int, cursor: int) -> None:
        chip, colors = self._chips[i], self.theme_colors
        if i == self._prompt_len and i:
            text.append(GENERATION_MARK, Style(color=colors.chip_newest, bold=True))
        shade = self._attribution_shade(i) or self._surprisal_shade(i)
        newest = i == len(self._chips) - 1 and not chip.is_prompt
        style = chip_style(colors, chip.is_prompt, chip.is_template, shade, newest, i == cursor, i == self.marked)
        text.append(piece_of(chip), style)
        spelt = self._spelled(i)
        if spelt:
            text.append(spelt, BOLD)
        if self.show_ids:
            text.append(f" {chip.id}", ID_STYLE)
            text.append(" ")
        text.append(" ")

    def _surprisal_shade(self, i: int) -> Style | None:
        """With the u key: a chip's background on the heatmap scale, by the surprisal (-log2 p) the
        model's raw distribution gave it at the position before (a prompt token's from the prefill);
        the first token has none."""
        selection = self.selection
        if not self.surprisal or selection is None or i == 0:
            return None
        s = selection.snapshot
        if not self._chips[i].is_prompt:
            k = i - s.prompt_len  # the record that decided this token
            if k >= len(s.records):
                return None
            bits = -math.log2(max(s.records[k].decision.raw_prob, 1e-300))
            return self._shade(bits / SURPRISAL_TOP_BITS)
        predictions = s.records[0].prompt_predictions if s.records else ()
        if i - 1 >= len(predictions):
            return None
        return self._shade(predictions[i - 1].surprisal / SURPRISAL_TOP_BITS)

    def _attribution_shade(self, i: int) -> Style | None:
        """With the attribution view open: a chip's background by the size of its score, the
        largest brightest."""
        a = self.attribution
        if a is None or i > a.position:
            return None
        return self._shade(abs(a.scores[i]) / self._attribution_top)

    def shade_by(self, attribution: Attribution | None) -> None:
        """Shade the chips by this attribution's scores (None: not)."""
        if attribution is not self.attribution:
            self.attribution = attribution
            self._attribution_top = attribution.largest if attribution else 1.0

    def _shade(self, fraction: float) -> Style:
        level = round(min(max(fraction, 0.0), 1.0) * (SHADES - 1))
        return _shade_styles(self.theme_colors.heatmap_stops)[level]

    @staticmethod
    def _text_to(s: Snapshot, cursor: int) -> str:
        """The decoded text up to the token at the cursor (all of it at the newest token, and after a
        stop at the newest the model read, so the token the stop took is in it), where the chips' pieces
        spell it: moving the cursor back (←, Home) brings the beginning back. The whole
        text, wrapped, is the text view's (D)."""
        newest_read = len(s.chips) - (2 if s.stop_reason else 1)  # the token a stop took is never fed
        whole = read_text(s.chips, s.full_text)  # (a tokenizer's <bos> is no one's text)
        if cursor >= newest_read:
            return whole
        prefix = read_text(s.chips, "".join(c.text for c in s.chips[: cursor + 1]))
        return prefix if whole.startswith(prefix) else whole

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
            how = (
                f"drawn by the server, p {probability(d.raw_prob)}"
                if d.mode == "drawn"
                else f"greedy: argmax, raw p {probability(d.raw_prob)}"
                if d.greedy
                else f"{d.mode}, final p {probability(d.chosen_prob)}"
            )
            return Text(f"→ next: {visible(d.chosen_text)} ({how})", Style(dim=True))
        if s.stop_reason:
            return Text(f"■ stopped: {s.stop_reason}", Style(dim=True, bold=True))
        return Text("")


BOLD = Style(bold=True)
ID_STYLE = Style(dim=True, italic=True)


@functools.lru_cache(maxsize=1024)
def chip_style(
    colors: ThemeColors, prompt: bool, template: bool, shade: Style | None, newest: bool, cursor: bool, marked: bool
) -> Style:
    """A chip's style, one object per look: a pane of chips shares a few Styles, and so rich
    combines each pair once rather than once per chip and frame."""
    if shade is not None:
        style = shade
    elif prompt:
        style = Style(bgcolor=colors.chip_prompt, dim=template)
    else:
        style = Style(bgcolor=colors.chip_generated, color=colors.chip_newest, dim=template)
    if newest:
        style += BOLD
    if cursor:
        style += Style(color=colors.chip_cursor, bold=True, underline=True)
    if marked:
        style += Style(reverse=True, bold=True)
    return style


@functools.lru_cache(maxsize=8)
def _shade_styles(stops: tuple[str, ...]) -> list[Style]:
    """The shades of a theme's scale as chip styles, built once (a frame asks once per chip)."""
    return [Style(bgcolor=color, color=legible_on(color)) for color in ramp(list(stops), SHADES)]
