"""Score a given text: how likely the model found each of its tokens, from one prefill.

The prefill computes a next-token distribution after every token anyway; scoring reads, for each
token after the first, the log-probability, probability and rank the model gave it there, the
entropy of that distribution and its top candidates; then the total and the perplexity.
"""

from __future__ import annotations

from typing import Any

from tokenviz.contract.errors import TokenvizError
from tokenviz.files.documents import score_document
from tokenviz.journey.session import Session


def score_text(session: Session, text: str, chat: bool = False, system: str | None = None) -> dict[str, Any]:
    """The score document of `text` (one forward pass over it, in the session's prefill chunks)."""
    session.start(text, chat=chat, system=system)
    predictions = session.records[0].prompt_predictions
    if not predictions:
        raise TokenvizError("the text is a single token: there is nothing to score after the first")
    return score_document(session.runner.info, session.chips(), predictions)
