"""A step an engine drew itself (a model server): its record from the top-N log-probabilities the server
returned, every number labelled for what it is.

The top candidates, the chosen token's probability and rank are the server's own (exp of its
log-probabilities). The sampling stages are recomputed here over the top-N only (the rest of the
vocabulary is unknown), and only where the server's log-probabilities are the model's raw ones; the
draw is the server's. The entropy is a floor: the top-N's share, plus the least the unknown rest can add.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from tokenviz.contract.records import Candidate, Decision, PinnedToken, Unsteered
from tokenviz.contract.results import Drawn
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.sampling import decide

REST_FLOOR = 1e-6  # the least mass kl_floor gives the unknown rest of a distribution (a float sum's error)
NEUTRAL = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)  # no stage: the server's are applied


def entropy_floor(logprobs: Sequence[float]) -> float:
    """The least entropy (bits) a distribution can have whose top log-probabilities are `logprobs`:
    their own share, plus the unknown rest's mass at the surprisal of the smallest known (no token
    of the rest is likelier than it)."""
    probs = [math.exp(lp) for lp in logprobs if lp > -math.inf]
    if not probs:
        return 0.0
    known = -sum(p * math.log2(p) for p in probs if p > 0)
    rest = max(1.0 - sum(probs), 0.0)
    return known + rest * -math.log2(min(probs))


def drawn_scores(known: dict[int, float], vocab: int) -> torch.Tensor:
    """The known log-probabilities as a vocabulary's scores: -inf where the server gave none."""
    scores = torch.full((vocab,), -math.inf)
    scores[torch.tensor(list(known))] = torch.tensor(list(known.values()), dtype=torch.float32)
    return scores


def drawn_top(drawn: Drawn, piece: Callable[[int], str], n: int) -> tuple[tuple[Candidate, ...], float]:
    """The server's top candidates (logit: its log-probability) and the entropy's floor in bits."""
    top = tuple(Candidate(id=t, text=piece(t), logit=lp, prob=math.exp(lp)) for t, lp in drawn.top[:n])
    return top, entropy_floor([lp for _, lp in drawn.top])


def forced_figures(drawn: Drawn, token: int, ask: Callable[[], tuple[float, int]]) -> tuple[int, float, int]:
    """(id, log-probability, rank) of a token forced at a drawn step: from what the server returned,
    else `ask`ed of it (one more request)."""
    rank = next((i for i, (t, _) in enumerate(drawn.top, 1) if t == token), None)
    if rank is not None:
        return token, dict(drawn.top)[token], rank
    if token == drawn.chosen:
        return token, drawn.logprob, drawn.rank
    return (token, *ask())


def drawn_decision(
    drawn: Drawn,
    settings: SamplingSettings,
    context_ids: Sequence[int],
    generated_ids: Sequence[int],
    piece: Callable[[int], str],
    vocab: int,
    forced: tuple[int, float, int] | None = None,
    pinned: Sequence[int] = (),
) -> Decision:
    """The decision of a drawn step: the stages recomputed over the top-N (none where the server's
    log-probabilities are after its own settings), the token the server drew, or `forced` (id,
    log-probability, rank) instead; the raw figures are the server's."""
    known = drawn.known
    chosen, logprob, rank = forced if forced is not None else (drawn.chosen, drawn.logprob, drawn.rank)
    known[chosen] = logprob
    scores = drawn_scores(known, vocab)
    staged = settings if drawn.raw else dataclasses.replace(NEUTRAL, seed=settings.seed)
    decision = decide(scores, staged, context_ids, generated_ids, piece, chosen, pinned)
    shown = [i for i, (t, _) in enumerate(decision.watch) if t in known]  # not the unknown rest's
    stages = tuple(
        dataclasses.replace(
            st,
            probs=tuple(st.probs[i] for i in shown),
            changed_watched=tuple(st.changed_watched[i] for i in shown if i < len(st.changed_watched)),
        )
        for st in decision.stages
    )
    return dataclasses.replace(
        decision,
        mode="forced" if forced is not None else "drawn",
        settings=settings,
        watch=tuple(decision.watch[i] for i in shown),
        stages=stages,
        raw_probs=tuple(math.exp(known[decision.watch[i][0]]) for i in shown),
        raw_prob=math.exp(logprob),
        raw_rank=rank,
        # With no stage (greedy, or the server's own stages applied) the final distribution is the one the
        # server gave: its probability, not one renormalised over the top-N.
        chosen_prob=decision.chosen_prob if decision.stages else math.exp(logprob),
        pinned=tuple(_exact_pinned(p, known, drawn.top) for p in decision.pinned),
    )


def kl_floor(p: dict[int, float], q: dict[int, float]) -> float:
    """The least KL(P ‖ Q) in bits two distributions can have of which only some log-probabilities are
    known (`p`, `q`: id to log-probability): the KL over the tokens both give, each alone, and everything
    else as one outcome. Merging outcomes never raises a KL (the log-sum inequality), so the whole
    vocabulary's is at least this. The rest of Q is taken as at least REST_FLOOR: a sum of rounded
    probabilities near 1 does not know it better, and a larger Q only lowers the bound."""
    both = p.keys() & q.keys()
    pi = np.array([math.exp(p[t]) for t in both])
    qi = np.array([math.exp(q[t]) for t in both])
    p_rest, q_rest = max(1.0 - float(pi.sum()), 0.0), max(1.0 - float(qi.sum()), 0.0)
    terms = [float(np.sum(pi * (np.log2(pi) - np.log2(qi)))) if len(both) else 0.0]
    if p_rest > 0:
        terms.append(p_rest * (math.log2(p_rest) - math.log2(max(q_rest, REST_FLOOR))))
    return max(sum(terms), 0.0)


def drawn_unsteered(drawn: Drawn, own: Drawn, piece: Callable[[int], str], n: int) -> Unsteered:
    """With interventions on a drawn step: the model's own top (`own`, a request without them) and the
    KL from it, a floor (only the two top-Ns are known)."""
    top = tuple(Candidate(id=t, text=piece(t), logit=lp, prob=math.exp(lp)) for t, lp in own.top[:n])
    return Unsteered(top=top, kl=kl_floor(drawn.known, own.known), ms=own.ms, kl_floor=True)


def _exact_pinned(token: PinnedToken, known: dict[int, float], top: tuple[tuple[int, float], ...]) -> PinnedToken:
    """A watched token's raw figures from the server: its probability where it gave one; else 0 and
    the rank just past the top-N (it lies somewhere below)."""
    if token.id in known:
        rank = next((i for i, (t, _) in enumerate(top, 1) if t == token.id), len(top) + 1)
        return dataclasses.replace(token, prob=math.exp(known[token.id]), rank=rank)
    return dataclasses.replace(token, prob=0.0, final_prob=0.0, rank=len(top) + 1)


def prompt_columns(
    entries: Sequence[dict[int, tuple[float, int]]], next_ids: Sequence[int], top: int
) -> dict[str, torch.Tensor]:
    """A prompt's predictions (as decoding.prompt_predictions.predict_positions gives them) from a
    server's prompt log-probabilities: per position, {id: (logprob, rank)} with the next token's own."""
    rows = len(next_ids)
    ids = np.zeros((rows, top), dtype=np.int64)
    logits = np.full((rows, top), -np.inf)
    columns = {k: np.zeros(rows) for k in ("entropy", "next_prob", "next_logprob")}
    ranks = np.zeros(rows, dtype=np.int32)
    for i, (entry, following) in enumerate(zip(entries, next_ids)):
        best = sorted(((t, lp) for t, (lp, r) in entry.items() if r <= top), key=lambda x: -x[1])[:top]
        ids[i, : len(best)] = [t for t, _ in best]
        logits[i, : len(best)] = [lp for _, lp in best]
        own, ranks[i] = entry[following]
        columns["next_logprob"][i], columns["next_prob"][i] = own, math.exp(own)
        columns["entropy"][i] = entropy_floor([lp for _, lp in best])
    return {
        "ids": torch.from_numpy(ids),
        "logits": torch.from_numpy(logits),
        "probs": torch.from_numpy(np.exp(logits)),
        "entropy": torch.from_numpy(columns["entropy"]),
        "next_prob": torch.from_numpy(columns["next_prob"]),
        "next_rank": torch.from_numpy(ranks),
        "next_logprob": torch.from_numpy(columns["next_logprob"]),
    }


def drawn_of(record_top: Sequence[Candidate], decision: Decision, raw: bool) -> Drawn:
    """A past drawn step's draw again, from its record: the top-N it kept and the token taken."""
    return Drawn(
        chosen=decision.chosen_id,
        logprob=math.log(decision.raw_prob) if decision.raw_prob > 0 else -math.inf,
        rank=decision.raw_rank,
        top=tuple((c.id, c.logit) for c in record_top),
        raw=raw,
        ms=0.0,
    )
