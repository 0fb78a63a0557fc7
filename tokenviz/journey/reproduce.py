"""Re-run a saved journey on a model and check that every token comes out the same."""

from __future__ import annotations

import math
import sys
from typing import Any

from tokenviz.contract.interventions import Intervention
from tokenviz.contract.records import Routing
from tokenviz.files.journey_schema import Journey, parse_journey
from tokenviz.journey.prompt import tokenize
from tokenviz.journey.session import Session

TINY = sys.float_info.min


def routed_elsewhere(kept: Routing | None, routing: Routing | None) -> bool:
    """Whether a recorded routing names other experts (or layers, or positions) than the one computed."""
    if kept is None:
        return False
    if routing is None:
        return True
    shape = (kept.layers, kept.k, kept.positions)
    return shape != (routing.layers, routing.k, routing.positions) or kept.experts != routing.experts


def logprob_apart(recorded: float, now: float) -> float:
    """How far apart two probabilities are, in nats of log-probability (a zero as the smallest float)."""
    return abs(math.log(max(recorded, TINY)) - math.log(max(now, TINY)))


def verify_journey(
    doc: dict[str, Any] | Journey, session: Session, logprob_tolerance: float | None = None
) -> tuple[int, int | None]:
    """Re-run the journey on `session`'s model: each step with its own settings and interventions,
    forced tokens forced; where the recording kept its routing (an MoE model's), the experts each
    layer chose must be the same too; with `logprob_tolerance` (a served model's, whose numbers are
    all a recording of it holds), the chosen token's log-probability within it too.

    Returns (steps checked, the first step whose token, experts or log-probability differ, or None).
    """
    journey = doc if isinstance(doc, Journey) else parse_journey(doc)
    records = journey.replay.records
    steps = records[: journey.generated]  # a step a token taken (the last record may be the pending one's)

    def interventions(i: int) -> tuple[Intervention, ...]:  # those in force at step i's forward pass
        return records[i].interventions if i < len(records) else ()

    prompt = [t.id for t in journey.prompt]
    if interventions(0):
        session.set_interventions(interventions(0), context=prompt)
    replay = journey.replay  # the prompt as typed, where it still gives these ids (its text and chips too)
    typed = tokenize(session.engine, replay.prompt_text, replay.chat, replay.system)[1] == prompt
    if typed:
        session.start(replay.prompt_text, chat=replay.chat, system=replay.system)
    else:
        session.start(prompt)
    if journey.replay.pinned:  # the watched tokens: their numbers are part of every step's record
        session.pin([token for token, _ in journey.replay.pinned])
    for i, step in enumerate(steps):
        if interventions(i) != session.interventions:
            session.set_interventions(interventions(i))
        settings, recorded = step.decision.settings, step.decision.chosen_id
        session.set_settings(settings.replace(max_new_tokens=max(settings.max_new_tokens, len(steps))))
        pending = session.pending
        if pending is None:
            return i, i
        if routed_elsewhere(records[i].routing, pending.routing):
            return i + 1, i
        forced = recorded if step.decision.mode == "forced" else None
        if forced is None and pending.decision.chosen_id != recorded:
            return i + 1, i
        if (
            logprob_tolerance is not None
            and i < len(records)
            and logprob_apart(records[i].decision.raw_prob, pending.decision.raw_prob) > logprob_tolerance
        ):
            return i + 1, i
        session.step(forced_id=forced)
    return len(steps), None
