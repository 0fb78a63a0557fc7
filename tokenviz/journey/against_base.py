"""`score --against-model`: a text scored on a model Q beside a base model, as llama-perplexity's
`--kl-divergence` scores it, so the figures are the ones llama.cpp's users measure and publish.

The text is tokenized by the base (llama-perplexity's base file holds the base's tokens) and cut into
windows of `size` tokens (as many whole windows as the text holds; at least two, llama-perplexity's
rule); each window begins with the BOS the tokenizer adds (its first token replaced by it), is fed alone
in one pass to each model, and its second half is scored: the positions from size/2 to the second to
last, each predicting the next. The statistics are decoding.perplexity_statistics'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tokenviz.contract.engine import Capability, Engine, OnProgress, require
from tokenviz.contract.errors import TokenvizError
from tokenviz.decoding.perplexity_statistics import BaseLogProbs, Tally, compare_token

DEFAULT_WINDOW = 512  # llama-perplexity's window
TAILS = 10  # the tokens listed where the two differ most, by KLD and by |Δp|
CHANGED_LISTED = 100  # the changed top-1s listed at most (all are counted)
TOP = 5  # each side's candidates shown at a tail
CONTEXT_TOKENS = 8  # the text before a tail's token shown with it

Candidates = list[tuple[int, float]]  # (token, probability), most likely first
Tops = list[tuple[int, Candidates, Candidates]]  # each scored token: its index in the text, Q's and the base's


def added_bos(engine: Engine, text: str) -> int | None:
    """The token the tokenizer puts before a text (a BOS), or None where it puts none."""
    with_special, without = engine.encode(text, special_tokens=True), engine.encode(text, special_tokens=False)
    added = len(with_special) - len(without)
    if added == 1 and with_special[1:] == without:
        return with_special[0]
    return None


def windows(ids: Sequence[int], size: int, bos: int | None) -> list[list[int]]:
    """The whole windows of `size` tokens in `ids`, each begun with `bos` where there is one."""
    cut = [list(ids[start : start + size]) for start in range(0, len(ids) - size + 1, size)]
    if bos is not None:
        for window in cut:
            window[0] = bos
    return cut


def score_against_base(
    q: Engine, base: Engine, text: str, size: int = DEFAULT_WINDOW, progress: OnProgress = None
) -> dict[str, Any]:
    """llama-perplexity's statistics of Q (`q`) against `base` over `text`'s windows of `size` tokens."""
    if size < 4:
        raise TokenvizError(f"--window must be at least 4 tokens, got {size}")
    q_scores = require(q, Capability.FULL_SCORES, "scoring against a base")
    base_scores = require(base, Capability.FULL_SCORES, "scoring against a base")
    ids = base.encode(text, special_tokens=True)
    if len(ids) < 2 * size:
        raise TokenvizError(
            f"the text is {len(ids):,} tokens: --window {size} needs at least {2 * size:,} "
            "(two windows, llama-perplexity's rule); give a longer text or a smaller --window"
        )
    cut = windows(ids, size, added_bos(base, text))
    first = size // 2
    tally, tops = Tally(), Tops()
    for done, window in enumerate(cut):
        base_rows = np.asarray(base_scores.full_scores(window, first), dtype=np.float32)
        q_rows = np.asarray(q_scores.full_scores(window, first), dtype=np.float32)
        if q_rows.shape[1] != base_rows.shape[1]:
            raise TokenvizError(
                f"the two models' vocabularies differ ({q_rows.shape[1]:,} and {base_rows.shape[1]:,} tokens): "
                "scoring one against the other needs the same tokens"
            )
        for row in range(size - 1 - first):  # the last position predicts past the window
            tally.add(compare_token(q_rows[row], BaseLogProbs.of(base_rows[row]), window[first + row + 1]))
            tops.append((done * size + first + row + 1, top_of(q_rows[row]), top_of(base_rows[row])))
        if progress is not None:
            progress(done + 1, len(cut))
    return {
        "model": q.info.to_json(),
        "base": base.info.to_json(),
        "window": size,
        "windows": len(cut),
        "tokens": len(ids),  # the text's, as the base tokenizes it
        "statistics": tally.statistics(),
        "tails": tails(tally, tops, ids, base),
    }


def top_of(logits: np.ndarray) -> Candidates:
    """The TOP most likely tokens of a row of logits, with their probabilities."""
    shifted = logits.astype(np.float64) - float(logits.max())
    probs = np.exp(shifted) / np.exp(shifted).sum()
    best = np.argpartition(-logits, TOP)[:TOP] if len(logits) > TOP else np.arange(len(logits))
    return [(int(i), float(probs[i])) for i in sorted(best, key=lambda i: -logits[i])]


def tails(tally: Tally, tops: Tops, ids: Sequence[int], base: Engine) -> dict[str, Any]:
    """Where the two differ most: the TAILS tokens of largest KLD and of largest |Δp|, and the tokens
    where their top-1s differ (CHANGED_LISTED at most, the first in the text), each with its index in
    the text's tokens, the text before it and both sides' top TOP."""

    def entry(k: int) -> dict[str, Any]:
        token, (index, q_top, base_top) = tally.tokens[k], tops[k]
        candidates = [[{"id": i, "text": base.piece(i), "prob": p} for i, p in side] for side in (q_top, base_top)]
        return {
            "index": index,
            "id": ids[index],
            "text": base.piece(ids[index]),
            "before": base.decode(ids[max(0, index - CONTEXT_TOKENS) : index]),
            "kld": token.kld,
            "dp": token.p_diff,
            "top": candidates[0],
            "base_top": candidates[1],
        }

    order = range(len(tally.tokens))
    changed = [k for k in order if tally.tokens[k].top != tally.tokens[k].top_base]
    return {
        "by_kld": [entry(k) for k in sorted(order, key=lambda k: -tally.tokens[k].kld)[:TAILS]],
        "by_dp": [entry(k) for k in sorted(order, key=lambda k: -abs(tally.tokens[k].p_diff))[:TAILS]],
        "changed_top": [entry(k) for k in changed[:CHANGED_LISTED]],
        "changed_top_count": len(changed),
    }
