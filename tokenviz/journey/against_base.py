"""`score --against-model`: a text scored on a model Q beside a base model, as llama-perplexity's
`--kl-divergence` scores it, so the figures are the ones llama.cpp's users measure and publish.

The text is tokenized by the base (llama-perplexity's base file holds the base's tokens) and cut into
windows of `size` tokens (as many whole windows as the text holds; at least two, llama-perplexity's
rule); each window begins with the BOS the tokenizer adds (its first token replaced by it), is fed alone
in one pass to each model, and its second half is scored: the positions from size/2 to the second to
last, each predicting the next. The statistics are decoding.perplexity_statistics'. A side that gives its
top N only (a server) is scored from its prompt's log-probabilities, every figure but the KLD. Where both
sides have a lens, it is read at the tails from what their scoring passes kept (KeptLenses): no pass of
its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tokenviz.contract.engine import Capability, Engine, LensOfScores, OnProgress, Residuals, refusal_of, require
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.results import LensAsk, LensLayer
from tokenviz.decoding.perplexity_statistics import BaseLogProbs, Tally, TokenComparison, compare_tokens, log_sum_exp
from tokenviz.files.record_json import as_json

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
    """llama-perplexity's statistics of Q (`q`) against `base` over `text`'s windows of `size` tokens. A side
    without the whole vocabulary's scores (a served model: its top N) is scored from its prompt's
    log-probabilities: every figure but the KLD, which sums over every token (perplexity_statistics)."""
    check_window(size)
    ids = base.encode(text, special_tokens=True)
    if len(ids) < 2 * size:
        raise TokenvizError(
            f"the text is {len(ids):,} tokens: --window {size} needs at least {2 * size:,} "
            "(two windows, llama-perplexity's rule); give a longer text or a smaller --window"
        )
    cut = windows(ids, size, added_bos(base, text))
    first = size // 2
    tally, tops = Tally(), Tops()
    kept = KeptLenses.of(q, base)
    for done, window in enumerate(cut):
        q_rows: np.ndarray | TopColumns
        base_rows: np.ndarray | TopColumns
        if kept is not None:  # each side's residuals kept in its scoring pass: the lens at the tails costs no pass
            (q_rows, q_kept), (base_rows, base_kept) = kept.scores(window, first)
        else:
            base_rows, q_rows = side_scores(base, window, first), side_scores(q, window, first)
        if (
            isinstance(q_rows, np.ndarray)
            and isinstance(base_rows, np.ndarray)
            and q_rows.shape[1] != base_rows.shape[1]
        ):
            raise TokenvizError(
                f"the two models' vocabularies differ ({q_rows.shape[1]:,} and {base_rows.shape[1]:,} tokens): "
                "scoring one against the other needs the same tokens"
            )
        scored = size - 1 - first  # the last position predicts past the window
        for start in range(0, scored, ROWS_AT_ONCE):
            rows = slice(start, min(start + ROWS_AT_ONCE, scored))
            tokens = np.array(window[first + 1 :][rows])
            compared, q_tops, base_tops = compare_rows(q_rows, base_rows, rows, tokens)
            for token in compared:
                tally.add(token)
            indices = range(done * size + first + 1 + rows.start, done * size + first + 1 + rows.stop)
            tops.extend(zip(indices, q_tops, base_tops, strict=True))
        if kept is not None:
            kept.keep(tally, range(len(tops) - scored, len(tops)), tops, (q_kept, base_kept), window[first + 1 :])
        if progress is not None:
            progress(done + 1, len(cut))
    return {
        "model": as_json(q.info),
        "base": as_json(base.info),
        "window": size,
        "windows": len(cut),
        "tokens": len(ids),  # the text's, as the base tokenizes it
        "statistics": tally.statistics(),
        "tails": tails(tally, tops, ids, base, kept or Parting(q, base, cut)),
        "scored": {  # each scored token, a column each: where it is in the text and what the two made of it
            "index": [index for index, _, _ in tops],
            "kld": [t.kld if math.isfinite(t.kld) else None for t in tally.tokens],
            "dp": [t.p_diff for t in tally.tokens],
            "changed": [t.top != t.top_base for t in tally.tokens],
        },
        "pieces": [base.piece(i) for i in ids[: len(cut) * size]],  # the windows' text, a token at a time
    }


def check_window(size: int) -> None:
    """Refuse, in one line, a window too small to score (its second half, less its last token)."""
    if size < 4:
        raise TokenvizError(f"the window must be at least 4 tokens, got {size}")


TopColumns = dict[str, np.ndarray]  # a side's prompt_predictions columns at a window's scored positions


def side_scores(engine: Engine, window: list[int], first: int) -> np.ndarray | TopColumns:
    """A side's scores after each of `window[first:]`: the whole vocabulary's (Capability.FULL_SCORES, float32
    rows), or else the prompt's predictions of its own pass over the window (a served model's: its top N,
    each next token's log-probability)."""
    if refusal_of(engine.info, Capability.FULL_SCORES, "") is None:
        full = require(engine, Capability.FULL_SCORES, "scoring against a base")
        return np.asarray(full.full_scores(window, first), dtype=np.float32)
    engine.reset()
    columns = engine.forward(list(window), every_position=True).predictions(window[1:])
    return {key: np.asarray(value.cpu().numpy())[first:] for key, value in columns.items()}


def compare_rows(
    q: np.ndarray | TopColumns, base: np.ndarray | TopColumns, rows: slice, tokens: np.ndarray
) -> tuple[list[TokenComparison], list[Candidates], list[Candidates]]:
    """The scored tokens of `rows` (compare_tokens where both sides give the whole vocabulary; else each
    side's log-probability of the text's token and top-1, the KLD NaN) and each side's top candidates."""
    if isinstance(q, np.ndarray) and isinstance(base, np.ndarray):
        stored = BaseLogProbs.of(base[rows])
        return (
            compare_tokens(q[rows], stored, tokens),
            top_candidates(q[rows]),
            top_candidates(stored.log_probs(), log_probs=True),
        )
    (q_nll, q_top, q_tops), (base_nll, base_top, base_tops) = (
        told(q, rows, tokens, False),
        told(base, rows, tokens, True),
    )
    p_diff = np.exp(-q_nll, dtype=np.float32) - np.exp(-base_nll, dtype=np.float32)
    columns = zip(q_nll.tolist(), base_nll.tolist(), p_diff.tolist(), q_top.tolist(), base_top.tolist(), strict=True)
    compared = [
        TokenComparison(nll, nll_base, math.nan, dp, top, top_base) for nll, nll_base, dp, top, top_base in columns
    ]
    return compared, q_tops, base_tops


def told(
    side: np.ndarray | TopColumns, rows: slice, tokens: np.ndarray, as_base: bool
) -> tuple[np.ndarray, np.ndarray, list[Candidates]]:
    """One side's negative log-likelihoods of `tokens`, top-1s and top candidates at `rows`: from its whole
    vocabulary as llama-perplexity computes them (a base's log-probabilities kept in its 16 bits), or from
    its top N."""
    at = np.arange(len(tokens))
    if isinstance(side, np.ndarray) and as_base:  # llama-perplexity's: the 16-bit log-probabilities as they are
        log_probs = BaseLogProbs.of(side[rows]).log_probs()
        return -log_probs[at, tokens], log_probs.argmax(axis=-1), top_candidates(log_probs, log_probs=True)
    if isinstance(side, np.ndarray):
        scores = np.asarray(side[rows], dtype=np.float32)
        top = scores.max(axis=-1, keepdims=True)
        nll = (top + log_sum_exp(scores, top))[:, 0] - scores[at, tokens]
        return nll.astype(np.float32), scores.argmax(axis=-1), top_candidates(scores)
    ids, probs = side["ids"][rows], side["probs"][rows]
    candidates = [list(zip(i, p, strict=True)) for i, p in zip(ids.tolist(), probs.tolist(), strict=True)]
    return (-side["next_logprob"][rows]).astype(np.float32), ids[:, 0], candidates


def top_candidates(rows: np.ndarray, log_probs: bool = False) -> list[Candidates]:
    """The TOP most likely tokens of each row of logits, with their probabilities; of `log_probs` (a base's as
    llama-perplexity keeps them), each its own probability, as Δp takes it (not renormalised: the tokens kept
    at the floor would take 0.3% from the top)."""
    rows = np.asarray(rows, dtype=np.float32)
    best = (
        np.argpartition(-rows, TOP, axis=-1)[:, :TOP]
        if rows.shape[1] > TOP
        else np.tile(np.arange(rows.shape[1]), (len(rows), 1))
    )
    values = np.take_along_axis(rows, best, -1)
    order = np.argsort(-values, axis=-1, kind="stable")
    best, values = np.take_along_axis(best, order, -1), np.take_along_axis(values, order, -1)
    if log_probs:
        probs = np.exp(values)
    else:
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


class KeptLenses:
    """Where two models' lenses part at a token, from what each side's own scoring pass kept (LensOfScores):
    after each window the residuals of the tokens that may yet be tails (the tails of the windows scored so
    far, tail_rows) are kept and the others let go, so the lens is read at the tails alone, in no pass of its
    own, and its last row is the scored distribution itself."""

    def __init__(self, q: LensOfScores, base: LensOfScores):
        self.sides = (q, base)
        self.rows: dict[int, tuple[int, Residuals, Residuals, int]] = {}  # a tally row: its index, Q's, base's, token
        self.read: dict[int, dict[str, Any] | None] = {}

    @classmethod
    def of(cls, q: Engine, base: Engine) -> KeptLenses | None:
        """The kept lenses of two engines that both give a lens and keep it in their scoring pass; else None."""
        lensed = all(refusal_of(e.info, Capability.LENS, "") is None for e in (q, base))
        if lensed and isinstance(q, LensOfScores) and isinstance(base, LensOfScores):
            return cls(q, base)
        return None

    def scores(self, window: list[int], first: int) -> list[tuple[np.ndarray, Residuals]]:
        """Each side's full scores of `window` after each of `window[first:]` (side_scores'), and the
        residuals there (the base's pass first, as side_scores runs them)."""
        q, base = self.sides
        base_scored = base.full_scores_kept(window, first)
        q_scored = q.full_scores_kept(window, first)
        return [(np.asarray(s.float().cpu().numpy(), np.float32), kept) for s, kept in (q_scored, base_scored)]

    def keep(self, tally: Tally, new: range, tops: Tops, kept: tuple[Residuals, Residuals], tokens: list[int]) -> None:
        """Keep the residuals of the tally's rows `new` (a window's scored rows, in order; `tokens` the text's
        token each predicts) that may yet be tails, and let go of those that no longer may."""
        by_kld, by_dp, changed = tail_rows(tally, [*self.rows, *new], kld_known=True)
        wanted = {*by_kld, *by_dp, *changed[:TAILS]}
        self.rows = {k: row for k, row in self.rows.items() if k in wanted}
        q, base = kept
        for k in sorted(wanted.intersection(new)):
            place = k - new.start
            self.rows[k] = (tops[k][0], q.at([place]), base.at([place]), tokens[place])

    def read_at(self, indices: Iterable[int]) -> None:
        """Read the two lenses at the text's tokens `indices` (each a tail: kept), all in one go a side."""
        asked = set(indices) - set(self.read)
        rows = [row for row in self.rows.values() if row[0] in asked]
        if not rows:
            return
        chosen = [token for _, _, _, token in rows]
        q_engine, base_engine = self.sides
        q = q_engine.lens_of(joined([row[1] for row in rows]), chosen)
        base = base_engine.lens_of(joined([row[2] for row in rows]), chosen)
        for row, q_seen, base_seen in zip(rows, q, base, strict=True):
            self.read[row[0]] = parted(q_seen.lens, base_seen.lens)

    def at(self, index: int) -> dict[str, Any] | None:
        """As Parting.at."""
        return self.read.get(index)


def joined(parts: Sequence[Residuals]) -> Residuals:
    """The positions of `parts` (one engine's) as one Residuals, in order."""
    import torch  # (here: the command line imports this module's defaults before any model, and torch with them)

    tokens = tuple(token for part in parts for token in part.tokens)
    return Residuals(torch.cat([p.stream for p in parts], 1), tokens, torch.cat([p.scores for p in parts]))


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


def tail_rows(tally: Tally, among: Iterable[int], kld_known: bool) -> tuple[list[int], list[int], list[int]]:
    """The tally's rows `among` (ascending: a tie goes to the first) of the TAILS largest KLDs (none where the
    KLD is not known) and |Δp|s, and those whose top-1s differ. The tails of all the rows are those of the
    tails of any parts of them: KeptLenses keeps no more."""
    order, tokens = sorted(among), tally.tokens
    changed = [k for k in order if tokens[k].top != tokens[k].top_base]
    by_kld = sorted(order, key=lambda k: -tokens[k].kld)[:TAILS] if kld_known else []
    by_dp = sorted(order, key=lambda k: -abs(tokens[k].p_diff))[:TAILS]
    return by_kld, by_dp, changed


def tails(tally: Tally, tops: Tops, ids: Sequence[int], base: Engine, parting: Parting | KeptLenses) -> dict[str, Any]:
    """Where the two differ most: the TAILS tokens of largest KLD and of largest |Δp|, and the tokens
    where their top-1s differ (CHANGED_LISTED at most, the first in the text), each with its index in
    the text's tokens, the text before it and both sides' top TOP; and where their lenses part, at the
    tails by KLD and |Δp| and the first TAILS changed top-1s (`lens`, null elsewhere)."""

    by_kld, by_dp, changed = tail_rows(tally, range(len(tally.tokens)), tally.kld_known)
    parting.read_at(tops[k][0] for k in (*by_kld, *by_dp, *changed[:TAILS]))

    def entry(k: int) -> dict[str, Any]:
        token, (index, q_top, base_top) = tally.tokens[k], tops[k]
        candidates = [[{"id": i, "text": base.piece(i), "prob": p} for i, p in side] for side in (q_top, base_top)]
        return {
            "index": index,
            "id": ids[index],
            "text": base.piece(ids[index]),
            "before": base.decode(ids[max(0, index - CONTEXT_TOKENS) : index]),
            "kld": token.kld if math.isfinite(token.kld) else None,
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
