"""Score a given text: how likely the model found each of its tokens, from one prefill.

The prefill computes a next-token distribution after every token anyway; scoring reads, for each
token after the first, the log-probability, probability and rank the model gave it there, the
entropy of that distribution and its top candidates; then the total and the perplexity. Under a
grammar, each token also gets its log-probability in the constrained distribution (the model's, kept
to the tokens the grammar allows there and renormalised, as the grammar stage makes it), from one
more pass over the text.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tokenviz.contract.engine import Caching, Capability, require
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.grammar import Grammar
from tokenviz.files.documents import score_document
from tokenviz.journey import memory_policy
from tokenviz.journey.chips import chips_of
from tokenviz.journey.session import Session


def score_text(
    session: Session, text: str, chat: bool = False, system: str | None = None, grammar: Grammar | None = None
) -> dict[str, Any]:
    """The score document of `text` (one forward pass over it, in the session's prefill chunks); with
    a `grammar`, which the text follows from its first token (after a BOS the tokenizer adds), each
    token's constrained log-probability too."""
    if grammar is not None and chat:
        raise TokenvizError("score --chat does not take a grammar: the chat template's tokens are not the grammar's")
    session.start(text, chat=chat, system=system)
    predictions = session.records[0].prompt_predictions
    if not predictions:
        raise TokenvizError("the text is a single token: there is nothing to score after the first")
    document = score_document(session.engine.info, chips_of(session), predictions)
    if grammar is not None:
        constrain(document, session, grammar)
    return document


@torch.inference_mode()
def constrain(document: dict[str, Any], session: Session, grammar: Grammar) -> None:
    """Add to each scored token its log-probability under `grammar` and the count it allows there;
    null from the first token the grammar does not allow (where the text leaves it)."""
    engine, ids = session.engine, session.ids
    cache: Caching = require(engine, Capability.CACHE, "a grammar's scores")
    first = 0
    while first < len(ids) - 1 and ids[first] in engine.special_ids:
        first += 1  # a BOS the tokenizer adds is not the text's
    settings = session.settings.replace(grammar=grammar)
    fits = session.grammars.fits(grammar, ids[first:])
    leaves_at = first + fits if first + fits < len(ids) else None  # the first token it does not allow
    total = 0.0
    by_index = {t["index"]: t for t in document["tokens"]}
    for start in range(0, len(ids) - 1, memory_policy.PREFILL_CHUNK):
        end = min(start + memory_policy.PREFILL_CHUNK, len(ids) - 1)
        logits = cache.logits_after(ids[: end + 1], start)[: end - start].float()
        for p in range(start, end):  # the distribution after token p, which token p + 1 is drawn from
            token = by_index[p + 1]
            if p + 1 <= first or (leaves_at is not None and p + 1 >= leaves_at):
                token["constrained"] = None
                continue
            allowed = session.grammars.allowed(settings, ids[first : p + 1])
            assert allowed is not None
            allowed = allowed.to(logits.device)
            logprob = float(torch.log_softmax(logits[p - start].masked_fill(~allowed, -math.inf), -1)[ids[p + 1]])
            total += logprob
            token["constrained"] = {"logprob": logprob, "allowed": int(allowed.sum())}
    document["grammar"] = {
        "grammar": grammar.label,
        "logprob": None if leaves_at is not None else total,  # of the text's tokens after the first
        "leaves_at": leaves_at,  # the index of the first token the grammar does not allow (0: the first), or null
    }
