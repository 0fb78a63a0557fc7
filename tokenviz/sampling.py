"""The sampling decision, every stage visible.

Pure: next-token logits + settings -> each stage's distribution + the draw + the chosen token.
The transformations are transformers' own LogitsProcessor classes, applied in generate()'s order
(penalties -> temperature -> top-k -> top-p -> min-p), so the numbers agree with generate().
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch
from transformers import (
    LogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tokenviz.records import SamplingRecord, Stage
from tokenviz.settings import SamplingSettings

WATCH_N = 12  # tokens followed through the stages: the raw top-n plus the final top-n


class PresenceFrequencyPenalty(LogitsProcessor):
    """OpenAI-style penalties: logit -= presence * [count > 0] + frequency * count.

    transformers has no processor for these; counts are over the generated tokens only.
    """

    def __init__(self, presence: float, frequency: float, generated_ids: Sequence[int]):
        self.presence = presence
        self.frequency = frequency
        self.generated_ids = list(generated_ids)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if not self.generated_ids:
            return scores
        counts = torch.zeros(scores.shape[-1], dtype=scores.dtype, device=scores.device)
        ids = torch.tensor(self.generated_ids, device=scores.device)
        counts.index_add_(0, ids, torch.ones(len(self.generated_ids), dtype=scores.dtype, device=scores.device))
        return scores - self.presence * (counts > 0).to(scores.dtype) - self.frequency * counts


def build_stages(settings: SamplingSettings, generated_ids: Sequence[int]) -> list[tuple[str, str, LogitsProcessor]]:
    """The active stages in order, as (name, detail, processor)."""
    s = settings
    stages: list[tuple[str, str, LogitsProcessor]] = []
    if s.repetition_penalty != 1.0:
        stages.append(("repetition", f"×{s.repetition_penalty:g}",
                       RepetitionPenaltyLogitsProcessor(penalty=float(s.repetition_penalty))))
    if s.presence_penalty or s.frequency_penalty:
        stages.append(("presence/frequency", f"{s.presence_penalty:g}/{s.frequency_penalty:g}",
                       PresenceFrequencyPenalty(s.presence_penalty, s.frequency_penalty, generated_ids)))
    if s.greedy:
        return stages
    if s.temperature != 1.0:
        stages.append(("temperature", f"T={s.temperature:g}", TemperatureLogitsWarper(float(s.temperature))))
    if s.top_k > 0:
        stages.append(("top-k", f"k={s.top_k}", TopKLogitsWarper(top_k=s.top_k)))
    if s.top_p < 1.0:
        stages.append(("top-p", f"p={s.top_p:g}", TopPLogitsWarper(top_p=float(s.top_p))))
    if s.min_p > 0:
        stages.append(("min-p", f"min={s.min_p:g}", MinPLogitsWarper(min_p=float(s.min_p))))
    return stages


def apply_stages(
    logits: torch.Tensor, settings: SamplingSettings, context_ids: Sequence[int], generated_ids: Sequence[int]
) -> list[tuple[str, str, torch.Tensor]]:
    """Every active stage's scores, (1, vocab) each, in float32 on the logits' device."""
    scores = logits.reshape(1, -1).float()
    input_ids = torch.tensor([list(context_ids)], dtype=torch.long, device=scores.device)
    out = []
    for name, detail, processor in build_stages(settings, generated_ids):
        scores = processor(input_ids, scores)
        out.append((name, detail, scores))
    return out


def draw_uniform(seed: int, position: int) -> float:
    """The uniform u for one position: a pure function of (seed, position).

    Re-deciding a step with other settings, or rewinding and stepping again, draws the same u.
    """
    generator = torch.Generator().manual_seed((seed * 1_000_003 + position) % (2**63))
    return float(torch.rand((), generator=generator, dtype=torch.float64))


def inverse_cdf(probs: torch.Tensor, u: float) -> tuple[int, int, float, float]:
    """Tokens in descending probability, the first whose cumulative band holds u wins.

    Returns (token id, 0-based rank, band low, band high).
    """
    sorted_probs, order = torch.sort(probs.double(), descending=True, stable=True)
    cumulative = torch.cumsum(sorted_probs, 0)
    possible = int((sorted_probs > 0).sum())
    rank = min(int(torch.searchsorted(cumulative, torch.tensor([u], dtype=torch.float64), right=True)), possible - 1)
    high = float(cumulative[rank])
    return int(order[rank]), rank, high - float(sorted_probs[rank]), high


def decide(
    logits: torch.Tensor,
    settings: SamplingSettings,
    context_ids: Sequence[int],
    generated_ids: Sequence[int],
    piece: Callable[[int], str],
    forced_id: int | None = None,
) -> SamplingRecord:
    """Run every stage on `logits` (vocab,) and choose the next token."""
    started = time.perf_counter()
    raw = torch.softmax(logits.float().reshape(-1), -1)
    stages = apply_stages(logits, settings, context_ids, generated_ids)
    final_scores = stages[-1][2][0] if stages else logits.float().reshape(-1)
    final = torch.softmax(final_scores, -1)

    u = band = None
    if forced_id is not None:
        mode, chosen = "forced", int(forced_id)
    elif settings.greedy:
        mode, chosen = "greedy", int(torch.argmax(final_scores))
    else:
        mode = "sampled"
        u = draw_uniform(settings.seed, len(context_ids))
        chosen, _, low, high = inverse_cdf(final, u)
        band = (low, high)

    n = min(WATCH_N, raw.numel())
    watch_ids = list(dict.fromkeys(
        torch.topk(raw, n).indices.tolist() + torch.topk(final, n).indices.tolist() + [chosen]
    ))
    watch = torch.tensor(watch_ids, device=raw.device)

    stage_records = []
    before = raw
    for name, detail, scores in stages:
        after = torch.softmax(scores[0], -1)
        finite = torch.isfinite(scores[0])
        stage_records.append(Stage(
            name=name, detail=detail, kept=int(finite.sum()),
            mass=float(before[finite].sum()), probs=tuple(after[watch].tolist()),
        ))
        before = after

    chosen_prob = float(final[chosen])
    return SamplingRecord(
        mode=mode,
        settings=settings.to_json(),
        watch=tuple((i, piece(i)) for i in watch_ids),
        raw_probs=tuple(raw[watch].tolist()),
        stages=tuple(stage_records),
        u=u,
        band=band,
        chosen_id=chosen,
        chosen_text=piece(chosen),
        chosen_prob=chosen_prob,
        chosen_rank=int((final > chosen_prob).sum()) + 1,
        raw_rank=int((raw > raw[chosen]).sum()) + 1,
        raw_prob=float(raw[chosen]),
        ms=(time.perf_counter() - started) * 1000,
    )
