"""Attribution pane: which earlier tokens led to the token after the cursor, strongest first."""

from __future__ import annotations

import math

from rich.style import Style
from rich.text import Text

from tokenviz.contract.commands import Attribute
from tokenviz.contract.results import Attribution, AttributionMethod
from tokenviz.render.bars import bar
from tokenviz.render.columns import cell
from tokenviz.render.units import probability
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import Run, ScrollPane, result_or_note
from tokenviz.ui.selection import Selection

EXPLAINED = {
    "loo": "leave-one-out: the change in log p when that one token is taken out (exact; one forward pass a token)",
    "grad": "gradient × input: the first-order change in log p from each token's embedding (one backward pass)",
}

RUN = Run(Attribute, "view('attribution')")
LONG_JOB_S = 10.0  # a job estimated at more than this is said before it starts


def estimated_s(
    selection: Selection, method: AttributionMethod, measured: tuple[int, float] | None = None
) -> float | None:
    """About how long attributing the token after the cursor takes. Leave-one-out feeds the context
    once per token (its cost grows with the square of the tokens), gradient × input once forward and
    once back (with the tokens). From `measured`, (tokens, seconds) of an earlier run of the same
    method here, where there is one; else from the prefill's speed, which overstates it (the prefill
    of a long prompt is slower a token than leave-one-out's batches of shorter ones: 2× at 200 and 600
    tokens of a 3,233-token prompt on the bundled model)."""
    n = selection.cursor + 1
    work = (n + 1) * n if method == "loo" else 3 * n
    if measured is not None:
        m, seconds = measured
        return seconds * work / ((m + 1) * m if method == "loo" else 3 * m)
    prefill = selection.snapshot.records[0]
    if prefill.forward_ms <= 0:
        return None
    return work / (len(prefill.input_ids) / (prefill.forward_ms / 1000))


def current_attribution(selection: Selection) -> Attribution | None:
    """The snapshot's attribution if it explains the token after the cursor in this journey, else None."""
    a = selection.snapshot.result(Attribute)
    if a is None or a.position != selection.cursor or a.target_id != selection.following_id:
        return None
    chips = selection.snapshot.chips
    return a if len(a.scores) == selection.cursor + 1 <= len(chips) else None


class AttributionPane(ScrollPane):
    TITLE = "attribution"
    DEFAULT_CSS = """
    AttributionPane > .body { text-wrap: nowrap; text-overflow: ellipsis; }
    AttributionPane > .body.-note { text-wrap: wrap; }
    """

    declined: str | None = None  # why leave-one-out was not run here (too long, and the user said not now)

    def draw(self, selection: Selection) -> None:
        body = self.body
        waiting = self.declined or "attributing the token after the cursor…"
        a = result_or_note(current_attribution(selection), selection, body, waiting, "attribution", RUN)
        if a is None:
            return
        chips = selection.snapshot.chips
        width = max(self.size.width - 2, 30)
        bar_w = max(width - 32, 4)
        top = a.largest
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"why {visible(a.target_text)} after position {a.position}", Style(bold=True))
        text.append(f"  log p {a.logprob:.3f} (p {probability(math.exp(a.logprob))})\n")
        text.append(EXPLAINED[a.method] + "\n", Style(dim=True))
        text.append("+ raised the token's log p   − lowered it   (chips shaded by size)\n", Style(dim=True))
        raised, lowered = Style(color=self.theme_colors.bar), Style(color=self.theme_colors.bar_final)
        for p in a.strongest(len(a.scores)):
            score = a.scores[p]
            text.append(cell(f"{visible(chips[p].text)}@{p}", 16) + " ")
            text.append(f"{score:+9.3f} ")
            text.append(bar(abs(score) / top, bar_w), raised if score >= 0 else lowered)
            text.append("\n")
        body.update(text)
