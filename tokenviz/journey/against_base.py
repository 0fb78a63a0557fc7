"""`score --against-model`: a text scored on a model Q beside a base model, as llama-perplexity's
`--kl-divergence` scores it, so the figures are the ones llama.cpp's users measure and publish.

The text is tokenized by the base (llama-perplexity's base file holds the base's tokens) and cut into
windows of `size` tokens (as many whole windows as the text holds; at least two, llama-perplexity's
rule); each window begins with the BOS the tokenizer adds (its first token replaced by it), is fed alone
in one pass to each model, and its second half is scored: the positions from size/2 to the second to
last, each predicting the next. The statistics are decoding.perplexity_statistics'.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tokenviz.contract.engine import Capability, Engine, OnProgress, refusal_of, require
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.results import LensAsk, LensLayer
from tokenviz.decoding.perplexity_statistics import BaseLogProbs, Tally, compare_tokens, log_sum_exp

DEFAULT_WINDOW = 512  # llama-perplexity's window
TAILS = 10  # the tokens listed where the two differ most, by KLD and by |Δp|
CHANGED_LISTED = 100  # the changed top-1s listed at most (all are counted)
TOP = 5  # each side's candidates shown at a tail
CONTEXT_TOKENS = 8  # the text before a tail's token shown with it
ROWS_AT_ONCE = 32  # positions compared in one go (each a row of the vocabulary, a few arrays of them held)

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
        scored = size - 1 - first  # the last position predicts past the window
        for start in range(0, scored, ROWS_AT_ONCE):
            rows = slice(start, min(start + ROWS_AT_ONCE, scored))
            stored = BaseLogProbs.of(base_rows[rows])
            tokens = np.array(window[first + 1 :][rows])
            for token in compare_tokens(q_rows[rows], stored, tokens):
                tally.add(token)
            q_tops, base_tops = top_candidates(q_rows[rows]), top_candidates(stored.log_probs())
            indices = range(done * size + first + 1 + rows.start, done * size + first + 1 + rows.stop)
            tops.extend(zip(indices, q_tops, base_tops, strict=True))
        if progress is not None:
            progress(done + 1, len(cut))
    return {
        "model": q.info.to_json(),
        "base": base.info.to_json(),
        "window": size,
        "windows": len(cut),
        "tokens": len(ids),  # the text's, as the base tokenizes it
        "statistics": tally.statistics(),
        "tails": tails(tally, tops, ids, base, Parting(q, base, cut)),
        "scored": {  # each scored token, a column each: where it is in the text and what the two made of it
            "index": [index for index, _, _ in tops],
            "kld": [t.kld for t in tally.tokens],
            "dp": [t.p_diff for t in tally.tokens],
            "changed": [t.top != t.top_base for t in tally.tokens],
        },
        "pieces": [base.piece(i) for i in ids[: len(cut) * size]],  # the windows' text, a token at a time
    }


def top_candidates(rows: np.ndarray) -> list[Candidates]:
    """The TOP most likely tokens of each row of logits (or log-probabilities), with their probabilities."""
    rows = np.asarray(rows, dtype=np.float32)
    best = (
        np.argpartition(-rows, TOP, axis=-1)[:, :TOP]
        if rows.shape[1] > TOP
        else np.tile(np.arange(rows.shape[1]), (len(rows), 1))
    )
    values = np.take_along_axis(rows, best, -1)
    order = np.argsort(-values, axis=-1, kind="stable")
    best, values = np.take_along_axis(best, order, -1), np.take_along_axis(values, order, -1)
    top = rows.max(axis=-1, keepdims=True)
    probs = np.exp(values - top - log_sum_exp(rows, top))
    return [list(zip(ids, p, strict=True)) for ids, p in zip(best.tolist(), probs.tolist(), strict=True)]


class Parting:
    """Where two models' lenses part at a token: each side's lens at the position that predicted it, read
    where both engines have a lens, at the tails alone: each window holding tails fed whole in one pass (the
    shape its scores came from) and its tails' positions read together."""

    def __init__(self, q: Engine, base: Engine, cut: list[list[int]]):
        self.sides = (q, base)
        self.cut = cut
        self.held = all(refusal_of(e.info, Capability.LENS, "") is None for e in self.sides)
        self.read: dict[int, dict[str, Any] | None] = {}

    def read_at(self, indices: Iterable[int]) -> None:
        """Read the two lenses at the text's tokens `indices` (see `at`)."""
        if not self.held:
            return
        size = len(self.cut[0])
        by_window: dict[int, list[int]] = {}
        for index in sorted(set(indices) - set(self.read)):
            by_window.setdefault(index // size, []).append(index % size)
        for w, places in by_window.items():
            window = self.cut[w]
            ask = LensAsk(tuple(window), tuple(p - 1 for p in places), tuple(window[p] for p in places))
            q, base = (self._lenses(engine, ask) for engine in self.sides)
            for place, q_lens, base_lens in zip(places, q, base, strict=True):
                self.read[w * size + place] = parted(q_lens, base_lens)

    def at(self, index: int) -> dict[str, Any] | None:
        """The two lenses at the text's token `index`, once read (None where they were not, or an engine has
        no lens): each layer's top-1 on each side, the first layer whose top-1s differ (`parts_at`) and the
        first from which they differ to the last (`parted_from`; None where the last agree), as lens rows (0
        the embeddings)."""
        return self.read.get(index)

    @staticmethod
    def _lenses(engine: Engine, ask: LensAsk) -> list[tuple[LensLayer, ...]]:
        lens = require(engine, Capability.LENS, "the lens at a tail")
        engine.reset()
        engine.forward(list(ask.ids))
        return [inspection.lens for inspection in lens.inspect(ask)]


def parted(q: tuple[LensLayer, ...], base: tuple[LensLayer, ...]) -> dict[str, Any] | None:
    """The two lenses' top-1s layer by layer, and where they part (None where their rows differ)."""
    if [row.layer for row in q] != [row.layer for row in base]:
        return None
    differ = [a.top[0][0] != b.top[0][0] for a, b in zip(q, base, strict=True)]
    parted_from = None
    for k in range(len(differ) - 1, -1, -1):
        if not differ[k]:
            break
        parted_from = q[k].layer
    return {
        "parts_at": next((q[k].layer for k, d in enumerate(differ) if d), None),
        "parted_from": parted_from,
        "top": [{"layer": row.layer, "id": row.top[0][0], "text": row.top[0][1], "prob": row.top[0][2]} for row in q],
        "base_top": [
            {"layer": row.layer, "id": row.top[0][0], "text": row.top[0][1], "prob": row.top[0][2]} for row in base
        ],
    }


def tails(tally: Tally, tops: Tops, ids: Sequence[int], base: Engine, parting: Parting) -> dict[str, Any]:
    """Where the two differ most: the TAILS tokens of largest KLD and of largest |Δp|, and the tokens
    where their top-1s differ (CHANGED_LISTED at most, the first in the text), each with its index in
    the text's tokens, the text before it and both sides' top TOP; and where their lenses part, at the
    tails by KLD and |Δp| and the first TAILS changed top-1s (`lens`, null elsewhere)."""

    order = range(len(tally.tokens))
    changed = [k for k in order if tally.tokens[k].top != tally.tokens[k].top_base]
    by_kld = sorted(order, key=lambda k: -tally.tokens[k].kld)[:TAILS]
    by_dp = sorted(order, key=lambda k: -abs(tally.tokens[k].p_diff))[:TAILS]
    parting.read_at(tops[k][0] for k in (*by_kld, *by_dp, *changed[:TAILS]))

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
            "lens": parting.at(index),
        }

    return {
        "by_kld": [entry(k) for k in by_kld],
        "by_dp": [entry(k) for k in by_dp],
        "changed_top": [entry(k) for k in changed[:CHANGED_LISTED]],
        "changed_top_count": len(changed),
    }
