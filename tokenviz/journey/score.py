"""Score a given text: how likely the model found each of its tokens, from one prefill.

The prefill computes a next-token distribution after every token anyway; scoring reads, for each
token after the first, the log-probability, probability and rank the model gave it there, the
entropy of that distribution and its top candidates; then the total and the perplexity.
"""

from __future__ import annotations

import math
from typing import Any

from tokenviz.contract.errors import TokenvizError
from tokenviz.journey.session import Session


def score_text(session: Session, text: str, chat: bool = False, system: str | None = None) -> dict[str, Any]:
    """The score document of `text` (one forward pass over it, in the session's prefill chunks)."""
    session.start(text, chat=chat, system=system)
    predictions = session.records[0].prompt_predictions
    if not predictions:
        raise TokenvizError("the text is a single token: there is nothing to score after the first")
    chips = session.chips()
    tokens = [
        {
            "index": p.position + 1,
            "id": p.next_id,
            "text": p.next_text,
            "logprob": p.logprob,
            "prob": p.next_prob,
            "rank": p.next_rank,
            "entropy": p.entropy,
            "top": [{"id": c.id, "text": c.text, "prob": c.prob} for c in p.top],
            **({"template": True} if chips[p.position + 1].is_template else {}),
        }
        for p in predictions
    ]
    total = sum(p.logprob for p in predictions)
    return {
        "model": session.runner.info.to_json(),
        "first": {"id": chips[0].id, "text": chips[0].text},  # read, never predicted
        "tokens": tokens,
        "logprob": total,
        "perplexity": math.exp(-total / len(tokens)),
    }
