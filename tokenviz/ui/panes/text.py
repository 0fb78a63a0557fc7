"""Text view: the journey's decoded text whole, wrapped and scrollable, the token at the cursor marked.

The tokens pane keeps one line of the text (its part up to the cursor); this view is where a long
answer is read from its beginning, at any terminal size."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from rich.style import Style
from rich.text import Text

from tokenviz.contract.records import TokenChip
from tokenviz.contract.text import safe_text
from tokenviz.ui.panes.base import ScrollPane
from tokenviz.ui.selection import Selection


def chip_spans(texts: list[str], full_text: str) -> list[tuple[int, int]] | None:
    """Each chip's characters in the decoded text, where the chips' pieces join into it exactly
    (None where they do not: a byte-level piece is not a character of its own)."""
    if "".join(texts) != full_text:
        return None
    spans, at = [], 0
    for text in texts:
        spans.append((at, at + len(text)))
        at += len(text)
    return spans


def unread(chips: Sequence[TokenChip]) -> str:
    """The text of the tokens no one wrote at the journey's start: the special tokens the tokenizer puts
    before the prompt outside the chat template (Gemma's `<bos>`: UX 7's finding 24). The tokens pane shows
    them as chips; the text leaves them out. (The leading ones alone: a frame's cost stays the screen's.)"""
    lead = itertools.takewhile(lambda c: c.is_prompt and c.is_special and not c.is_template, chips)
    return "".join(c.text for c in lead)


def read_text(chips: Sequence[TokenChip], full_text: str) -> str:
    """`full_text` without the unread tokens' characters at its start."""
    return full_text.removeprefix(unread(chips))


ANSWER_CONTEXT = 2  # lines of the prompt kept above the answer where the view opens


class TextPane(ScrollPane):
    TITLE = "text"

    _opening = True  # the next draw scrolls to the answer (its first, and the first after it was hidden)

    def on_hide(self) -> None:  # only the view in front is drawn: its next draw is its opening
        self._opening = True

    def draw(self, selection: Selection) -> None:
        s = selection.snapshot
        full = s.full_text
        spans = chip_spans([c.text for c in s.chips], full)
        prompt_end = spans[s.prompt_len - 1][1] if spans and s.prompt_len else 0
        marked = spans[selection.cursor] if spans and 0 <= selection.cursor < len(spans) else (len(full), len(full))
        hidden = [(0, len(unread(s.chips)))] if spans and full.startswith(unread(s.chips)) else []
        cuts = sorted({0, prompt_end, *marked, len(full), *(at for span in hidden for at in span)})
        text = Text()
        for start, end in itertools.pairwise(cuts):  # the prompt dim, the cursor's token reversed
            if any(a <= start and end <= b for a, b in hidden):
                continue
            style = Style(dim=end <= prompt_end, reverse=marked[0] <= start and end <= marked[1])
            text.append(safe_text(full[start:end]), style)
        generated, characters = len(s.chips) - s.prompt_len, len(full) - sum(b - a for a, b in hidden)
        self.set_subtitle(  # the fullest that fits the border (at 80x24 the first was cut: "54 generated tok…")
            f"{characters:,} characters · {generated} generated tokens · ↑ ↓ PgUp PgDn scroll",
            f"{characters:,} characters · {generated} generated tokens",
            f"{characters:,} chars · {generated} generated",
            f"{generated} generated",
        )
        self.body.update(text)
        if self._opening:  # where the answer starts (in chat, after the system prompt and template), not the top
            self._opening = False
            width = max(self.body.content_size.width or self.size.width - 2, 1)
            prompt = safe_text(read_text(s.chips, full[:prompt_end]))
            before = len(text[: len(prompt)].wrap(self.app.console, width)) if prompt_end else 0
            self.call_after_refresh(self.scroll_to, y=max(before - 1 - ANSWER_CONTEXT, 0), animate=False)
