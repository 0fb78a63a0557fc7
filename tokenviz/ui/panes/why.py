"""Why view: why the journey's text looks as it does, read off what it measured (journey.diagnosis):
each symptom, its cause, the evidence by position and the remedy the settings offer. The status line
names the first; this view says them all, once the journey has stopped and its text is whole."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from tokenviz.contract.text import safe_text
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import ScrollPane
from tokenviz.ui.selection import Selection

MAX_LISTED = 8  # of a list of positions or steps, the first shown
NOT_YET = (
    "Once the journey stops, this says why its text looks as it does, from what it measured: cut off "
    "mid-sentence (the new-token limit), repetitive (a run of tokens that comes back, and the steps where "
    "the loop won), inconsistent or incoherent (draws far down the model's ranking at a high temperature). "
    "Whether a format was followed is the model's or a grammar's, and is not guessed at."
)


def evidence_text(evidence: dict[str, Any]) -> str:
    """The evidence as `name value` pairs: a step as `@position #rank p 0.123`, a list as its first
    few, a text as its visible pieces."""
    return " · ".join(f"{name.replace('_', ' ')} {shown(value)}" for name, value in evidence.items())


def shown(value: Any) -> str:
    if isinstance(value, str):
        return visible(safe_text(value))
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict) and {"position", "rank", "raw_p"} <= value.keys():
        return f"@{value['position']} #{value['rank']} p {value['raw_p']:.3f}"
    if isinstance(value, list | tuple):
        more = f", … {len(value)} in all" if len(value) > MAX_LISTED else ""
        return "[" + ", ".join(shown(v) for v in value[:MAX_LISTED]) + more + "]"
    return safe_text(str(value))


class WhyPane(ScrollPane):
    TITLE = "why the text looks as it does"

    def draw(self, selection: Selection) -> None:
        s = selection.snapshot
        text = Text()
        if not s.stop_reason:
            text.append(NOT_YET, style="dim")
        elif not s.why:
            text.append(f"Stopped ({s.stop_reason}): nothing unexpected measured in its text.")
        for symptom in s.why:
            text.append(f"{symptom.symptom}\n", style=f"bold {self.theme_colors.chosen}")
            text.append("  cause: ", style="bold").append(f"{symptom.cause}\n")
            if symptom.evidence:
                text.append("  evidence: ", style="bold").append(f"{evidence_text(symptom.evidence)}\n")
            text.append("  remedy: ", style="bold").append(f"{symptom.remedy}\n\n")
        text.rstrip()
        self.border_subtitle = f"{len(s.why)} found" if s.stop_reason else "once it stops"
        self.body.update(text)
