"""Why view: why the journey's text looks as it does, read off what it measured (journey.diagnosis):
each symptom, its cause, the evidence by position and the remedy the settings offer. The status line
names the first; this view says them all, once the journey has stopped and its text is whole."""

from __future__ import annotations

from typing import Any

from rich.style import Style
from rich.text import Text

from tokenviz.contract.snapshot import Snapshot
from tokenviz.contract.text import safe_text
from tokenviz.render.units import probability
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import ScrollPane
from tokenviz.ui.selection import Selection

MAX_LISTED = 8  # of a list of positions or steps, the first shown
LEAST_SURE = 3  # the steps listed where the model was least sure, by each measure
CHECKED = (
    "Checked: the new-token limit (cut off), runs of tokens that come back (repetitive), draws far down the "
    "model's ranking (incoherent: past rank 10 above a temperature of 1, past 100 at any). Not judged: "
    "whether it is true or what you meant; "
    "a fact is the model's to know. Where it was least sure, the steps to read first (click one to put the "
    "cursor there, or move it with ← and →):"
)
NOT_YET = (
    "Once the journey stops, this says why its text looks as it does, from what it measured: cut off "
    "mid-sentence (the new-token limit), repetitive (a run of tokens that comes back, and the steps where "
    "the loop won), inconsistent or incoherent (draws far down the model's ranking: past rank 10 above a "
    "temperature of 1, past 100 at any). "
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
        return f"@{value['position']} #{value['rank']} p {probability(value['raw_p'])}"
    if isinstance(value, list | tuple):
        more = f", … {len(value)} in all" if len(value) > MAX_LISTED else ""
        return "[" + ", ".join(shown(v) for v in value[:MAX_LISTED]) + more + "]"
    return safe_text(str(value))


def least_sure_text(s: Snapshot, color: str) -> Text:
    """What the diagnosis checked and cannot judge, then the steps where the model was least sure of the
    token taken (its own probability of it, lowest) and of the next (its entropy, highest), each a link
    that moves the cursor there (JourneyScreen.action_jump)."""
    text = Text(CHECKED + "\n", style="dim")
    taken = s.records[: len(s.chips) - s.prompt_len]  # the steps whose token the text holds
    for label, ranked in (
        ("lowest p of the token taken", sorted(taken, key=lambda r: r.decision.raw_prob)),
        ("highest entropy", sorted(taken, key=lambda r: -r.entropy)),
    ):
        text.append(f"  {label}: ", style="bold")
        for n, r in enumerate(ranked[:LEAST_SURE]):
            link = Style(color=color, underline=True, meta={"@click": f"screen.jump({r.position - 1})"})
            text.append(" · " if n else "")
            text.append(f"step {r.index} {visible(r.decision.chosen_text)}", style=link)
            text.append(f" p {probability(r.decision.raw_prob)} · {r.entropy:.2f} bits", style="dim")
        text.append("\n")
    return text


class WhyPane(ScrollPane):
    TITLE = "why the text looks as it does"

    def draw(self, selection: Selection) -> None:
        s = selection.snapshot
        text = Text()
        if not s.stop_reason:
            text.append(NOT_YET, style="dim")
        elif not s.why:
            text.append(f"Stopped ({s.stop_reason}): none of the symptoms it measures.\n\n")
        for symptom in s.why:
            text.append(f"{symptom.symptom}\n", style=f"bold {self.theme_colors.chosen}")
            text.append("  cause: ", style="bold").append(f"{symptom.cause}\n")
            if symptom.evidence:
                text.append("  evidence: ", style="bold").append(f"{evidence_text(symptom.evidence)}\n")
            text.append("  remedy: ", style="bold").append(f"{symptom.remedy}\n\n")
        if s.stop_reason:
            text.append(least_sure_text(s, self.theme_colors.chosen))
        text.rstrip()
        self.border_subtitle = f"{len(s.why)} found" if s.stop_reason else "once it stops"
        self.body.update(text)
