"""Attribution pane: which earlier tokens led to the token after the cursor, strongest first."""

from __future__ import annotations

import math
import time
from typing import Any

from rich.style import Style
from rich.text import Text

from tokenviz.contract.commands import Attribute
from tokenviz.contract.results import Attribution, AttributionMethod
from tokenviz.contract.snapshot import Snapshot
from tokenviz.render.bars import bar
from tokenviz.render.columns import cell
from tokenviz.render.units import duration, probability
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import RowsPane, Run, result_or_note
from tokenviz.ui.screens import LongJobScreen
from tokenviz.ui.selection import Selection

EXPLAINED = {
    "loo": "leave-one-out: the change in log p when that one token is taken out (exact; one forward pass a token)",
    "grad": "gradient × input: the first-order change in log p from each token's embedding (one backward pass)",
}

RUN = Run(Attribute, "view('attribution')")
LONG_JOB_S = 10.0  # a job estimated at more than this is said before it starts
TIMED_FROM_S = 1.0  # an attribution that took this long or more times the next estimate (see estimated_s)


def estimated_s(
    selection: Selection, method: AttributionMethod, measured: tuple[int, float] | None = None
) -> float | None:
    """About how long attributing the token after the cursor takes. Leave-one-out feeds the context
    once per token, n + 1 passes of about n tokens; gradient × input once forward and once back (about
    three passes of n). From `measured`, (tokens, seconds) of an earlier run of the same method here,
    where there is one; else from the passes the journey measured: a pass of k tokens costs what a
    step does (a pass's own overhead, a short context's whole cost) or k times a prompt token (a long
    one's), a prompt token at most what a step costs (the first prefill carries the start's warm-up: a
    7-token prompt's made a 10-token leave-one-out look like 1 min 41 s where it takes seconds)."""
    n = selection.cursor + 1
    passes = n + 1 if method == "loo" else 3
    if measured is not None:
        m, seconds = measured
        return seconds * (passes * n) / ((m + 1) * m if method == "loo" else 3 * m)
    records = selection.snapshot.records
    prefill = records[0]
    if prefill.forward_ms <= 0:
        return None
    token_ms = prefill.forward_ms / max(len(prefill.input_ids), 1)
    steps = sorted(r.forward_ms for r in records[max(1, len(records) - STEPS_TIMED) :] if r.forward_ms > 0)
    step_ms = steps[len(steps) // 2] if steps else None  # (the median: a step slowed by a view is not its cost)
    pass_ms = n * token_ms if step_ms is None else max(step_ms, n * min(token_ms, step_ms))
    return passes * pass_ms / 1000


STEPS_TIMED = 20  # the latest steps whose passes time an estimate


def current_attribution(selection: Selection) -> Attribution | None:
    """The snapshot's attribution if it explains the token after the cursor in this journey, else None."""
    a = selection.snapshot.result(Attribute)
    if a is None or a.position != selection.cursor or a.target_id != selection.following_id:
        return None
    chips = selection.snapshot.chips
    return a if len(a.scores) == selection.cursor + 1 <= len(chips) else None


class AttributionPane(RowsPane):
    TITLE = "attribution"

    declined: str | None = None  # why leave-one-out was not run here (too long, and the user said not now)
    method: AttributionMethod = "loo"  # the A key's; the palette offers both
    long_ok = False  # the user ran a long leave-one-out: do not ask again

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # This machine's speed, measured: the request sent (method, position, when), and by method the
        # (tokens, seconds) of the last run, which the next estimate scales (see estimated_s).
        self._sent: tuple[str, int, float] | None = None
        self.measured: dict[str, tuple[int, float]] = {}

    def action_attribution(self, method: AttributionMethod) -> None:
        """The view by `method` (the palette's two entries)."""
        self.method = method
        self.journey.open_view("attribution")

    def send_now(self, request: Attribute, selection: Selection) -> bool:
        """Whether to send `request` at once: a leave-one-out estimated to take long asks the user first
        (and sends it, or gradient × input instead, as they answer)."""
        self.declined = None
        s, measured = selection.snapshot, self.measured.get
        loo_s = estimated_s(selection, "loo", measured("loo")) if request.method == "loo" and s.live else None
        if loo_s is not None and loo_s > LONG_JOB_S and not self.long_ok:
            self._ask(request, loo_s, estimated_s(selection, "grad", measured("grad")) or 0.0)
            return False
        self._sent = (request.method, request.position, time.perf_counter())
        return True

    def timed(self, before: Snapshot | None, s: Snapshot) -> None:
        """A new attribution for the request sent: how long it took, for the next estimate."""
        sent, a = self._sent, s.result(Attribute)
        if sent is None or a is None or (before is not None and before.result(Attribute) is a):
            return
        if (a.method, a.position) == sent[:2]:
            seconds = time.perf_counter() - sent[2]
            if seconds >= TIMED_FROM_S:  # an answer kept from before comes at once: not a speed
                self.measured[a.method] = (a.position + 1, seconds)
            self._sent = None

    def _ask(self, request: Attribute, loo_s: float, grad_s: float) -> None:
        journey, n = self.journey, request.position + 1

        def chosen(answer: str | None) -> None:
            if answer == "loo":
                self.long_ok = True
                journey.submit(request)
            elif answer == "grad":
                self.action_attribution("grad")
            else:
                self.declined = f"leave-one-out not run: about {duration(loo_s)} here. Press A twice to be asked again."
                journey.refresh_panes()

        question = (
            f"Leave-one-out runs the model once for each of the {n} tokens before the cursor: about "
            f"{duration(loo_s)} on this machine (Escape cancels it midway)."
        )
        loo = (f"leave-one-out anyway, about {duration(loo_s)} (exact; not asked again)", "loo")
        grad = (f"gradient × input instead: one forward and one backward pass, about {duration(grad_s)}", "grad")
        # leave-one-out first: the default, as the docs say (a served model has no gradient: it alone)
        choices = [loo, grad] if journey.refusal_of("attribution('grad')") is None else [loo]
        self.app.push_screen(LongJobScreen(question, choices), chosen)

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
