"""Beam search, every step recorded: the candidates of every beam, which survive, which are pruned.

Follows transformers' generate(num_beams=k, do_sample=False): each step keeps the 2k best
continuations over all beams (by accumulated log-probability); those ending in EOS, or reaching the
length limit, become finished hypotheses scored by log-probability / length ** length_penalty; the
best k unfinished continue. The bookkeeping is here; an engine gives the passes (`BeamPasses`): the
scores after the context, then after each beam's next token once the beams are reordered.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

import torch

from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.contract.results import BeamCandidate, BeamFate, BeamResult, BeamStep, Hypothesis

PRUNED = -1.0e9
WIDTHS = range(2, 9)  # the beam widths a search takes


class BeamPasses(Protocol):
    """An engine's passes for a search, on a cache of its own (the journey's is not touched)."""

    def first(self) -> torch.Tensor:
        """The scores after the context, (1, vocab): the search starts as one beam."""

    def advance(self, source: torch.Tensor, tokens: torch.Tensor, moved: bool) -> torch.Tensor:
        """Beam i goes on from beam `source[i]` with `tokens[i]` (`moved`: some beam is not where it
        was): the scores after each, (width, vocab)."""


def check_width(width: int) -> None:
    """Refuse a width outside WIDTHS in one line (before an engine makes room for its beams)."""
    if width not in WIDTHS:
        raise TokenvizError(f"beam width must be {WIDTHS.start} to {WIDTHS.stop - 1}, got {width}")


def beam_search_over(
    passes: BeamPasses,
    vocab: int,
    eos_ids: Collection[int],
    piece: Callable[[int], str],
    width: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> BeamResult:
    """`progress(steps done, steps)` is told and `cancelled()` asked before each step (a True ends
    the search with Cancelled)."""
    check_width(width)
    out = passes.first()
    device = out.device
    eos = torch.tensor(sorted(eos_ids) or [-1], device=device)
    keep = max(2, 1 + len(eos_ids)) * width
    running: list[tuple[int, ...]] = [()]
    scores = torch.zeros(1, device=device)
    in_order = torch.arange(width, device=device)
    finished: list[Hypothesis] = []
    steps = []
    for step in range(max_new_tokens):
        progress(step, max_new_tokens)
        if cancelled():
            raise Cancelled("beam search cancelled")
        log_probs = torch.log_softmax(out.float(), -1)
        accumulated = (log_probs + scores[:, None]).view(-1)
        top_scores, top_index = torch.topk(accumulated, keep)
        beam, token = top_index // vocab, top_index % vocab
        last = step + 1 == max_new_tokens
        ended = torch.isin(token, eos)
        hits = ended | last
        # Only the best `width` candidates may finish; the rest are a reserve to keep `width` running.
        for j in range(width):
            if hits[j]:
                ids = running[int(beam[j])] + (int(token[j]),)
                finished.append(
                    Hypothesis(
                        ids,
                        "".join(piece(t) for t in ids),
                        float(top_scores[j]),
                        float(top_scores[j]) / (len(ids) ** length_penalty),
                        end_of_text=bool(ended[j]),
                    )
                )
        finished = sorted(finished, key=lambda h: -h.score)[:width]
        running_scores = top_scores + hits.float() * PRUNED
        chosen = torch.topk(running_scores, width).indices
        chosen_set = set(chosen.tolist())
        alive = [(ids, sc) for ids, sc in zip(running, scores.tolist()) if sc > PRUNED / 2]
        steps.append(
            BeamStep(
                index=step,
                beams=tuple((ids, float(sc)) for ids, sc in alive),
                candidates=tuple(
                    BeamCandidate(
                        beam=int(beam[j]),
                        id=int(token[j]),
                        text=piece(int(token[j])),
                        token_logprob=float(log_probs[beam[j], token[j]]),
                        score=float(top_scores[j]),
                        fate=_fate(bool(hits[j]) and j < width, bool(ended[j]), j in chosen_set and not hits[j]),
                    )
                    for j in range(keep)
                ),
                texts=tuple("".join(piece(t) for t in ids) for ids, _ in alive),
            )
        )
        if last or (
            len(finished) == width
            and finished[-1].score >= float(running_scores.max()) / ((step + 1) ** length_penalty)
        ):
            break
        source = beam[chosen]
        running = [running[int(b)] + (int(t),) for b, t in zip(source, token[chosen])]
        scores = running_scores[chosen]
        out = passes.advance(source, token[chosen], moved=step == 0 or not torch.equal(source, in_order))
    return BeamResult(width=width, steps=tuple(steps), final=tuple(finished))


def _fate(finishes: bool, end_of_text: bool, kept: bool) -> BeamFate:
    if finishes:
        return "finished" if end_of_text else "at length limit"
    return "kept" if kept else "pruned"
