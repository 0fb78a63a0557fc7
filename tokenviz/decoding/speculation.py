"""Speculative decoding, every round recorded: a cheap drafter proposes tokens, the target model
checks them all in one forward pass, accepts a prefix and replaces the first rejected token.

Drafters draft greedily, so their proposal is deterministic (q is one-hot). The accept/reject rule
is then: accept draft d with probability p(d); on rejection draw from p with d removed. With
greedy settings that means: accept while d is the target's argmax. Either way the output has
exactly the target's distribution, so speculation changes the speed, never the text's law. The
rounds are here; an engine gives the target's passes (`TargetPasses`) and any drafter of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

import torch

from tokenviz.contract.errors import Cancelled
from tokenviz.contract.grammar import refuse_grammar
from tokenviz.contract.results import Round, Speculation
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.sampling import apply_stages, draw_uniform, inverse_cdf

DRAFT_LEN = 4


class Drafter(Protocol):
    name: str

    def draft(self, ids: list[int], n: int) -> list[int]: ...


class TargetPasses(Protocol):
    """The target model's passes, on a cache of its own that holds all of the context but its last token."""

    def verify(self, feed: list[int]) -> torch.Tensor:
        """The scores after each of `feed`, fed after what the cache holds: (len(feed), vocab)."""

    def keep(self, length: int) -> None:
        """The cache cut to its first `length` positions (what rejected drafts left goes)."""


class PromptLookup:
    """Propose what followed the last occurrence of the context's final n-gram (n = 3, 2, 1)."""

    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3):
        self.max_ngram = max_ngram

    def draft(self, ids: list[int], n: int) -> list[int]:
        for size in range(min(self.max_ngram, len(ids) - 1), 0, -1):
            tail = ids[-size:]
            for start in range(len(ids) - size - 1, -1, -1):
                if ids[start : start + size] == tail:
                    follow = ids[start + size : start + size + n]
                    if follow:
                        return follow
        return []


def accept_or_replace(probs: torch.Tensor, drafted: int, u_accept: float, u_replace: float) -> tuple[bool, int]:
    """The accept/reject rule for a deterministic draft: accept with probability p(drafted); else
    draw from p with `drafted` removed (renormalised). The result is distributed exactly as p."""
    if u_accept < float(probs[drafted]):
        return True, drafted
    residual = probs.clone()
    residual[drafted] = 0
    total = float(residual.sum())
    if total <= 0:  # p put all its mass on the draft: it is accepted whatever u is
        return True, drafted
    return False, inverse_cdf(residual / total, u_replace)[0]


def speculate_over(
    passes: TargetPasses,
    prompt_ids: list[int],
    drafter: Drafter,
    max_new_tokens: int,
    settings: SamplingSettings,
    eos_ids: Collection[int],
    piece: Callable[[int], str],
    draft_len: int = DRAFT_LEN,
    cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> Speculation:
    """`cancelled()` is asked before each round; a True ends the run with Cancelled."""
    refuse_grammar(settings.grammar, "speculative decoding")
    ids = list(prompt_ids)
    start = len(ids)
    rounds = []
    while len(ids) - start < max_new_tokens:
        progress(len(ids) - start, max_new_tokens)
        if cancelled():
            raise Cancelled("speculative decoding cancelled")
        room = min(draft_len, max_new_tokens - (len(ids) - start) - 1)
        drafted = drafter.draft(ids, room) if room > 0 else []
        feed = [ids[-1], *drafted]
        logits = passes.verify(feed)
        accepted, rejected_at, new = 0, None, list[int]()
        for i in range(len(feed)):
            context = ids + new
            stages = apply_stages(logits[i], settings, context, context[start:])
            scores = stages[-1][2][0] if stages else logits[i].float()
            position = len(context)
            if settings.greedy:
                target = int(scores.argmax())
                ok = i < len(drafted) and drafted[i] == target
            elif i < len(drafted):
                ok, target = accept_or_replace(
                    torch.softmax(scores, -1),
                    drafted[i],
                    draw_uniform(settings.seed, position),
                    draw_uniform(settings.seed + 1, position),
                )
            else:
                ok, target = False, inverse_cdf(torch.softmax(scores, -1), draw_uniform(settings.seed, position))[0]
            if ok:
                accepted += 1
                new.append(target)
                continue
            if i < len(drafted):
                rejected_at = i
            new.append(target)
            break
        rounds.append(Round(drafted=tuple(drafted), accepted=accepted, next_id=new[-1], rejected_at=rejected_at))
        ids += new
        passes.keep(len(ids) - 1)  # what the rejected drafts left in the cache goes
        eos = next((k for k, t in enumerate(ids[start:]) if t in eos_ids), None)
        if eos is not None:
            ids = ids[: start + eos + 1]
            break
    texts = {t: piece(t) for r in rounds for t in (*r.drafted, r.next_id)}
    return Speculation(
        drafter=drafter.name, rounds=tuple(rounds), ids=tuple(ids[start : start + max_new_tokens]), texts=texts
    )
