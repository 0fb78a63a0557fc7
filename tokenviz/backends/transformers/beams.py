"""Beam search, every step recorded: the candidates of every beam, which survive, which are pruned.

Follows transformers' generate(num_beams=k, do_sample=False): each step keeps the 2k best
continuations over all beams (by accumulated log-probability); those ending in EOS, or reaching the
length limit, become finished hypotheses scored by log-probability / length ** length_penalty; the
best k unfinished continue. It runs on its own batch-of-k cache, so the journey's cache is untouched;
given the runner's cache of the context (a journey's), it starts from a copy of it instead of feeding
the whole context again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch

from tokenviz.backends.transformers.cache import cache_prefix, full_cache, with_cache
from tokenviz.backends.transformers.loaded_model_access import ModelAccess
from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.contract.results import BeamCandidate, BeamFate, BeamResult, BeamStep, Hypothesis

PRUNED = -1.0e9


@torch.inference_mode()
def beam_search(
    runner: ModelAccess,
    prompt_ids: list[int],
    width: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    cancelled: Callable[[], bool] = lambda: False,
    from_cache: bool = False,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> BeamResult:
    """`progress(steps done, steps)` is told and `cancelled()` asked before each step (a True ends
    the search with Cancelled). With `from_cache`, the runner's cache holds at least
    `prompt_ids[:-1]`, and a copy of it is the start (see cache_prefix)."""
    if not 2 <= width <= 8:
        raise TokenvizError(f"beam width must be 2 to 8, got {width}")
    model, device, vocab = runner.model, runner.device, runner.info.vocab
    eos = torch.tensor(sorted(runner.eos_ids) or [-1], device=device)
    keep = max(2, 1 + len(runner.eos_ids)) * width
    fed = len(prompt_ids) - 1 if from_cache else 0
    cache = cache_prefix(runner.cache, fed) if fed else full_cache()
    # The search starts as one beam (the others would be copies, pruned at once); the first reorder
    # makes the cache `width` beams wide.
    out = model(
        input_ids=torch.tensor([prompt_ids[fed:]], device=device),
        **with_cache(model, cache),
        use_cache=True,
        logits_to_keep=1,
    )
    running: list[tuple[int, ...]] = [()]
    scores = torch.zeros(1, device=device)
    in_order = torch.arange(width, device=device)
    finished: list[Hypothesis] = []
    steps = []
    for step in range(max_new_tokens):
        progress(step, max_new_tokens)
        if cancelled():
            raise Cancelled("beam search cancelled")
        log_probs = torch.log_softmax(out.logits[:, -1, :].float(), -1)
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
                        "".join(runner.piece(t) for t in ids),
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
                        text=runner.piece(int(token[j])),
                        token_logprob=float(log_probs[beam[j], token[j]]),
                        score=float(top_scores[j]),
                        fate=_fate(bool(hits[j]) and j < width, bool(ended[j]), j in chosen_set and not hits[j]),
                    )
                    for j in range(keep)
                ),
                texts=tuple("".join(runner.piece(t) for t in ids) for ids, _ in alive),
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
        if step == 0 or not torch.equal(source, in_order):  # (the beams in their places: nothing to move)
            cache.reorder_cache(cast(torch.LongTensor, source))
        out = model(input_ids=token[chosen].view(width, 1), **with_cache(model, cache), use_cache=True)
    return BeamResult(width=width, steps=tuple(steps), final=tuple(finished))


def _fate(finishes: bool, end_of_text: bool, kept: bool) -> BeamFate:
    if finishes:
        return "finished" if end_of_text else "at length limit"
    return "kept" if kept else "pruned"
