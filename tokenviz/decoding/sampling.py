"""The sampling decision, every stage visible.

Pure: next-token logits + settings -> each stage's distribution + the draw + the chosen token.
The transformations are transformers' own LogitsProcessor classes, applied in generate()'s order
(penalties -> temperature -> top-k -> top-p -> min-p), so the numbers agree with generate().
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import (
    LogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.records import (
    GRAMMAR,
    PRESENCE_FREQUENCY,
    REPETITION,
    Candidate,
    Decision,
    DecisionMode,
    PinnedToken,
    Stage,
)
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.grammar import GrammarMask
from tokenviz.tensors import transfer, vocabulary_rows
from tokenviz.tensors.threads import one_thread_on_cpu
from tokenviz.tensors.transfer import DeviceTimer, at, ids_to_device, to_host

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
        ids = ids_to_device(self.generated_ids, scores.device)[0]
        counts.index_add_(0, ids, torch.ones(len(self.generated_ids), dtype=scores.dtype, device=scores.device))
        penalised = scores - self.presence * (counts > 0).to(scores.dtype) - self.frequency * counts
        return penalised  # type: ignore[return-value]  # transformers types processors with FloatTensor


NOTHING_ALLOWED = "the grammar allows no token after this text: it left the grammar earlier"
NOT_A_NUMBER = (
    "the model's output here is not a number (NaN or infinite logits), so no token can be chosen: its weights "
    "may be damaged, or the dtype overflows (try --dtype float32)"
)


@dataclass(frozen=True)
class StageKind:
    """One kind of sampling stage: when the settings turn it on, how its detail reads, and the
    transformers processor that applies it. `sampling` stages are skipped by greedy decoding."""

    name: str
    active: Callable[[SamplingSettings], bool]
    detail: Callable[[SamplingSettings], str]
    processor: Callable[[SamplingSettings, Sequence[int], torch.Tensor | None], LogitsProcessor]
    sampling: bool = False


def _grammar_mask(s: SamplingSettings, generated_ids: Sequence[int], allowed: torch.Tensor | None) -> GrammarMask:
    if allowed is None:
        raise ValueError("a grammar stage needs the grammar's mask for this context")
    return GrammarMask(allowed)


# In generate()'s order: the penalties, a logits processor of the user's (the grammar's mask), then
# temperature and the truncations. A new stage is one entry here (and its setting).
STAGE_KINDS: tuple[StageKind, ...] = (
    StageKind(
        REPETITION,
        lambda s: s.repetition_penalty != 1.0,
        lambda s: f"×{s.repetition_penalty:g}",
        lambda s, g, a: RepetitionPenaltyLogitsProcessor(penalty=float(s.repetition_penalty)),
    ),
    StageKind(
        PRESENCE_FREQUENCY,
        lambda s: bool(s.presence_penalty or s.frequency_penalty),
        lambda s: f"{s.presence_penalty:g}/{s.frequency_penalty:g}",
        lambda s, g, a: PresenceFrequencyPenalty(s.presence_penalty, s.frequency_penalty, g),
    ),
    StageKind(
        GRAMMAR,
        lambda s: s.grammar is not None,
        lambda s: s.grammar.label if s.grammar is not None else "",
        _grammar_mask,
    ),
    StageKind(
        "temperature",
        lambda s: s.temperature != 1.0,
        lambda s: f"T={s.temperature:g}",
        lambda s, g, a: TemperatureLogitsWarper(float(s.temperature)),
        sampling=True,
    ),
    StageKind(
        "top-k",
        lambda s: s.top_k > 0,
        lambda s: f"k={s.top_k}",
        lambda s, g, a: TopKLogitsWarper(top_k=s.top_k),
        sampling=True,
    ),
    StageKind(
        "top-p",
        lambda s: s.top_p < 1.0,
        lambda s: f"p={s.top_p:g}",
        lambda s, g, a: TopPLogitsWarper(top_p=float(s.top_p)),
        sampling=True,
    ),
    StageKind(
        "min-p",
        lambda s: s.min_p > 0,
        lambda s: f"min={s.min_p:g}",
        lambda s, g, a: MinPLogitsWarper(min_p=float(s.min_p)),
        sampling=True,
    ),
)


def build_stages(
    settings: SamplingSettings, generated_ids: Sequence[int], allowed: torch.Tensor | None = None
) -> list[tuple[str, str, LogitsProcessor]]:
    """The active stages in order, as (name, detail, processor). With a grammar, `allowed` is its
    mask for this context (GrammarMatchers.allowed)."""
    return [
        (kind.name, kind.detail(settings), kind.processor(settings, generated_ids, allowed))
        for kind in STAGE_KINDS
        if kind.active(settings) and not (settings.greedy and kind.sampling)
    ]


def apply_stages(
    logits: torch.Tensor,
    settings: SamplingSettings,
    context_ids: Sequence[int],
    generated_ids: Sequence[int],
    allowed: torch.Tensor | None = None,
) -> list[tuple[str, str, torch.Tensor]]:
    """Every active stage's scores, (1, vocab) each, in float32 on the logits' device."""
    stages = build_stages(settings, generated_ids, allowed)
    if not stages:  # greedy with no penalty: nothing to queue on the device
        return []
    scores = logits.reshape(1, -1).float()
    # the context's ids: only the repetition penalty reads them (the others' input_ids go unread)
    reads_context = any(name == REPETITION for name, _, _ in stages)
    input_ids = ids_to_device(context_ids if reads_context else [], scores.device)
    out = []
    for name, detail, processor in stages:
        scores = processor(input_ids, scores)
        out.append((name, detail, scores))
    return out


def draw_uniform(seed: int, position: int) -> float:
    """The uniform u for one position: a pure function of (seed, position), computed on the host.

    Re-deciding a step with other settings, or rewinding and stepping again, draws the same u.
    """
    return float(np.random.default_rng([seed, position]).random())


def _inverse_cdf_on_device(probs: torch.Tensor, u: float) -> tuple[torch.Tensor, ...]:
    """(token id, 0-based rank, band low, band high) as device tensors: nothing waits for the device.
    On a CPU, where reading a number waits for nothing, only the tokens that can be drawn are sorted
    (after top-k or top-p a few dozen of the vocabulary: the whole one's stable float64 sort took the
    bundled model 1.2 ms a step); their order, sums and band are the whole sort's first ones."""
    order = None
    if probs.device.type == "cpu":
        possible = probs.nonzero().reshape(-1)  # ids in ascending order: the stable sort's order of ties
        if 0 < possible.numel() < probs.numel():
            sorted_probs, within = torch.sort(probs[possible].double(), descending=True, stable=True)
            order = possible[within]
    if order is None:
        sorted_probs, order = torch.sort(probs.double(), descending=True, stable=True)
    cumulative = torch.cumsum(sorted_probs, 0)
    last_possible = ((sorted_probs > 0).sum() - 1).clamp(min=0)  # 0 when nothing is possible: NaN
    rank = torch.minimum(torch.searchsorted(cumulative, u, right=True), last_possible)
    high = at(cumulative, rank)
    return at(order, rank), rank, high - at(sorted_probs, rank), high


def inverse_cdf(probs: torch.Tensor, u: float) -> tuple[int, int, float, float]:
    """Tokens in descending probability, the first whose cumulative band holds u wins.

    Returns (token id, 0-based rank, band low, band high).
    """
    token, rank, low, high = torch.stack([t.double() for t in _inverse_cdf_on_device(probs, u)]).tolist()
    return int(token), int(rank), low, high


def final_distribution(
    logits: torch.Tensor,
    settings: SamplingSettings,
    context_ids: Sequence[int],
    generated_ids: Sequence[int],
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """The distribution a step's decision draws from, (vocab,): every stage applied, then softmax;
    greedy's is one-hot on its argmax; all zeros where a grammar allows nothing."""
    stages = apply_stages(logits, settings, context_ids, generated_ids, allowed)
    scores = stages[-1][2][0] if stages else logits.float().reshape(-1)
    if not bool(torch.isfinite(scores).any()):
        return torch.zeros_like(scores)
    if settings.greedy:
        return torch.nn.functional.one_hot(scores.argmax(), scores.numel()).float()
    return torch.softmax(scores, -1) if stages else vocabulary_rows.softmax(scores)  # (as _decide's)


def choice_from(final: torch.Tensor, settings: SamplingSettings, position: int) -> int:
    """The token the decision takes from `final` at `position`: the argmax, or the draw of (seed, position)."""
    if settings.greedy:
        return int(final.argmax())
    return inverse_cdf(final, draw_uniform(settings.seed, position))[0]


def vocabulary_row(logits: torch.Tensor) -> torch.Tensor:
    """`logits` as one float32 row: themselves where they are one (no operator call: see _summarised_in_numpy)."""
    return logits if logits.dtype == torch.float32 and logits.dim() == 1 else logits.float().reshape(-1)


def summarise(logits: torch.Tensor, n: int) -> PendingSummary:
    """Top-n of the model's raw softmax and its entropy in bits, still on the device (a CPU's in numpy:
    _summarised_in_numpy). Its softmax, its ranking (of the logits, whose order the softmax keeps) and
    the largest logit serve the decision too (decide_on_device's `summary`): one of each a step."""
    logits = vocabulary_row(logits)
    if transfer.numpy_reads(logits):
        on_host = _summarised_in_numpy(logits.detach().numpy(), n)
        if on_host is not None:
            return on_host
    with one_thread_on_cpu(logits.device):
        probs = vocabulary_rows.softmax(logits)
        entropy = probs.log().mul_(probs).nansum() * NATS_TO_MINUS_BITS  # 0 log 0 is NaN: counted 0
        top_logits, ranked = torch.topk(logits, min(max(n, WATCH_N), logits.numel()))
    top_ids = ranked[:n]
    # one part for the transfer: each costs a step its operator calls
    numbers = torch.cat([top_logits[:n], probs[top_ids], entropy.reshape(1)]).double()
    return PendingSummary({"summary.ids": top_ids, "summary.numbers": numbers}, probs, ranked, top_logits[0])


NATS_TO_MINUS_BITS = -1 / math.log(2)  # sum p ln p times this: the entropy in bits


def _summarised_in_numpy(x: np.ndarray, n: int) -> PendingSummary | None:
    """summarise's numbers from a row in the host's memory, in numpy (see tensors.vocabulary_rows). The
    entropy as ln Σe − Σ p·(x − max), a pass fewer than Σ p ln p. None where a logit is not a number or
    +inf, or none is finite (torch's path says what is wrong)."""
    ranked = vocabulary_rows.top_k_in_numpy(x, max(n, WATCH_N))
    if ranked is None or not np.isfinite(ranked[0][0]):
        return None
    top_logits, ids = ranked
    probs, shifted, total = vocabulary_rows.softmax_in_numpy(x, top_logits[:1])  # (the lens's last row's)
    with np.errstate(invalid="ignore"):
        spread = np.dot(probs, shifted)
    if not np.isfinite(spread):  # a -inf logit's 0·-inf: counted 0, as Σ p ln p counts 0 log 0
        kept = probs > 0
        spread = np.dot(probs[kept], shifted[kept])
    entropy = (math.log(float(total[0])) - float(spread)) / math.log(2)
    numbers = np.concatenate([top_logits[:n], probs[ids[:n]], [entropy]], dtype=np.float64)
    tensors = {"summary.ids": torch.from_numpy(ids[:n]), "summary.numbers": torch.from_numpy(numbers)}
    largest = torch.from_numpy(top_logits[:1]).reshape(())
    return PendingSummary(tensors, torch.from_numpy(probs), torch.from_numpy(ids), largest, on_host=True)


@dataclass
class PendingSummary:
    tensors: dict[str, torch.Tensor]
    probs: torch.Tensor  # the raw softmax, (vocab,) float32 on the device
    ranked: torch.Tensor  # the most probable ids, most probable first: at least WATCH_N of them
    largest: torch.Tensor  # the largest logit, ranked's first (NaN where any is: top-k ranks NaN first)
    on_host: bool = False  # made in numpy: every logit a number, ranked's first the argmax

    def read(self, host: dict[str, np.ndarray], piece: Callable[[int], str]) -> tuple[tuple[Candidate, ...], float]:
        """(top candidates, entropy in bits) from the host copies of `tensors`."""
        ids, numbers = host["summary.ids"].tolist(), host["summary.numbers"].tolist()
        n = len(ids)
        top = tuple(
            Candidate(id=i, text=piece(i), logit=lg, prob=p) for i, lg, p in zip(ids, numbers[:n], numbers[n : 2 * n])
        )
        return top, numbers[2 * n]


def decide_on_device(
    logits: torch.Tensor,
    settings: SamplingSettings,
    context_ids: Sequence[int],
    generated_ids: Sequence[int],
    forced_id: int | None = None,
    pinned: Sequence[int] = (),
    allowed: torch.Tensor | None = None,
    summary: PendingSummary | None = None,
) -> PendingDecision:
    """Run every stage on `logits` (vocab,) and choose the next token, all on the logits' device (on
    one thread on a CPU); follow the `pinned` tokens through it. `allowed`: see build_stages. With the
    `summary` of the same logits, its softmax and ranking are used, not made again."""
    with one_thread_on_cpu(logits.device):
        return _decide(logits, settings, context_ids, generated_ids, forced_id, pinned, allowed, summary)


def _decide(
    logits: torch.Tensor,
    settings: SamplingSettings,
    context_ids: Sequence[int],
    generated_ids: Sequence[int],
    forced_id: int | None,
    pinned: Sequence[int],
    allowed: torch.Tensor | None,
    summary: PendingSummary | None,
) -> PendingDecision:
    timer = DeviceTimer(logits.device)
    only_argmax = settings.greedy and forced_id is None and not build_stages(settings, generated_ids, allowed)
    if summary is not None and summary.on_host and only_argmax and not pinned:  # nothing else to run
        return _greedy_in_numpy(summary, settings, timer)
    device = logits.device
    raw_scores = vocabulary_row(logits)
    raw = summary.probs if summary is not None else vocabulary_rows.softmax(raw_scores)  # one softmax: a
    # step decided again has the numbers it had (numpy's on a CPU: see tensors.vocabulary_rows)
    stages = apply_stages(logits, settings, context_ids, generated_ids, allowed)
    # Every stage's scores as the rows of one tensor, and each stage's distribution in one softmax: the
    # stages' rows below are then a few operator calls whatever the number of stages.
    staged = None
    if stages:
        stage_scores = torch.cat([scores for _, _, scores in stages])
        staged = (stage_scores, torch.softmax(stage_scores, -1))
    final_scores, final = (staged[0][-1], staged[1][-1]) if staged else (raw_scores, raw)

    u = None
    mode: DecisionMode
    low = high = torch.zeros((), dtype=torch.float64, device=device)
    if forced_id is not None:
        mode, chosen = "forced", torch.full((), int(forced_id), dtype=torch.long, device=device)
    elif settings.greedy:
        mode, chosen = "greedy", vocabulary_rows.argmax(final_scores)
    else:
        mode = "sampled"
        u = draw_uniform(settings.seed, len(context_ids))
        chosen, _, low, high = _inverse_cdf_on_device(final, u)

    n = min(WATCH_N, raw.numel())
    # The watched tokens, duplicates included: the host keeps each token's first appearance.
    raw_top = summary.ranked[:n] if summary is not None else torch.topk(raw, n).indices
    final_top = raw_top if final is raw else torch.topk(final, n).indices
    watch = torch.cat([raw_top, final_top, chosen.reshape(1)])
    stage_rows = _stage_rows(*staged, raw_scores, raw, watch).reshape(-1) if staged else None  # see _stage_rows

    chosen_prob = at(final, chosen)
    raw_prob = chosen_prob if final is raw else at(raw, chosen)
    if mode == "greedy" and final is raw:  # the raw argmax: no probability is above its own
        raw_rank = torch.ones((), dtype=torch.long, device=device)
    else:
        raw_rank = (raw > raw_prob).sum() + 1
    # One reduction says whether every logit is a number or -inf (a server's unknown rest) and one is
    # finite: the largest is NaN where any is, +inf where any is, -inf where none is finite.
    numbers = torch.isfinite(summary.largest if summary is not None else raw_scores.max())
    any_left = numbers if final_scores is raw_scores else torch.isfinite(final_scores.max())
    # stacked with the float64 band: every one float64, exactly, without a conversion of its own each
    scalars = torch.stack(
        [
            chosen,
            chosen_prob,
            raw_rank if final is raw else (final > chosen_prob).sum() + 1,
            raw_rank,
            raw_prob,
            low,
            high,
            numbers,  # read with the rest: no extra wait
            any_left,
        ]
    ).double()
    # The numbers in one part (see summarise): the scalars, the watched raw probabilities, the stages' rows.
    parts = [scalars, raw[watch]] + ([stage_rows] if stage_rows is not None else [])
    tensors = {"decision.watch": watch, "decision.numbers": torch.cat(parts)}
    if pinned:  # nothing to queue on the device when no token is watched
        tensors["decision.pinned"] = pinned_on_device(raw, final, pinned)
    return PendingDecision(
        tensors, mode, settings, tuple((name, detail) for name, detail, _ in stages), u, timer.stop(), tuple(pinned)
    )


def _greedy_in_numpy(summary: PendingSummary, settings: SamplingSettings, timer: DeviceTimer) -> PendingDecision:
    """_decide's numbers where the raw distribution is the final one and its argmax is taken, from a
    summary made in numpy (see _summarised_in_numpy): its ranking's first is the argmax (the first id of
    the largest), every logit a number. The same numbers in the same layout, without an operator call."""
    probs, ranked = summary.probs.numpy(), summary.ranked.numpy()
    top = ranked[: min(WATCH_N, ranked.size)]
    chosen = int(ranked[0])
    watch = np.concatenate([top, top, ranked[:1]])
    chosen_prob = float(probs[chosen])
    scalars = [chosen, chosen_prob, 1, 1, chosen_prob, 0.0, 0.0, True, True]  # see _decide's scalars
    numbers = np.concatenate([np.array(scalars, dtype=np.float64), probs[watch]], dtype=np.float64)
    tensors = {"decision.watch": torch.from_numpy(watch), "decision.numbers": torch.from_numpy(numbers)}
    return PendingDecision(tensors, "greedy", settings, (), None, timer.stop())


def _stage_rows(
    stage_scores: torch.Tensor, afters: torch.Tensor, raw_scores: torch.Tensor, raw: torch.Tensor, watch: torch.Tensor
) -> torch.Tensor:
    """One float64 row per stage, from every stage's scores and distribution (stages, vocab): tokens kept,
    the previous stage's mass they held, the tokens whose score it changed (what a penalty penalised),
    the watched probabilities, and whether it changed each."""
    before_scores = torch.cat([raw_scores[None], stage_scores[:-1]])  # each stage's input, row by row
    before = torch.cat([raw[None], afters[:-1]])
    finite = stage_scores > -math.inf  # kept: a stage removes a token with -inf; one pass, where isfinite is four
    changed = stage_scores != before_scores
    # a mask, not indexing: no data-dependent shape. A share of a distribution is at most 1: summed in
    # float32, 49,152 rounded probabilities made 1.0000017, which a journey file rightly refuses.
    mass = torch.where(finite, before, 0).sum(-1, dtype=torch.float64).clamp(max=1.0)
    return torch.cat(  # float64, as `mass`: every part converted, exactly, in the one call
        [
            finite.sum(-1, keepdim=True),
            mass[:, None],
            changed.sum(-1, keepdim=True),
            afters[:, watch],
            changed[:, watch],
        ],
        1,
    )


def pinned_on_device(raw: torch.Tensor, final: torch.Tensor, pinned: Sequence[int]) -> torch.Tensor:
    """(len(pinned), 3) float64: each pinned token's raw probability, final probability and raw rank."""
    ids = ids_to_device(pinned, raw.device)[0]
    p = raw[ids]
    rank = (raw[None, :] > p[:, None]).sum(-1) + 1
    return torch.stack([p.double(), final[ids].double(), rank.double()], -1)


def read_pinned(
    rows: np.ndarray, pinned: Sequence[int], piece: Callable[[int], str], greedy_choice: int | None
) -> tuple[PinnedToken, ...]:
    """The PinnedTokens from `pinned_on_device`'s host copy; greedy's final distribution is one-hot."""
    return tuple(
        PinnedToken(
            id=token,
            text=piece(token),
            prob=float(prob),
            final_prob=float(final) if greedy_choice is None else float(token == greedy_choice),
            rank=int(rank),
        )
        for token, (prob, final, rank) in zip(pinned, rows.tolist())
    )


def follow_pinned(
    logits: torch.Tensor,
    decision: Decision,
    context_ids: Sequence[int],
    generated_ids: Sequence[int],
    pinned: Sequence[int],
    piece: Callable[[int], str],
    allowed: torch.Tensor | None = None,
) -> tuple[PinnedToken, ...]:
    """The pinned tokens at a step already decided: its logits again through its own settings."""
    stages = apply_stages(logits, decision.settings, context_ids, generated_ids, allowed)
    raw = vocabulary_rows.softmax(vocabulary_row(logits))
    final = torch.softmax(stages[-1][2][0], -1) if stages else raw
    rows = to_host({"pinned": pinned_on_device(raw, final, pinned)})["pinned"]
    return read_pinned(rows, pinned, piece, decision.chosen_id if decision.mode == "greedy" else None)


SCALARS = 9  # the decision's scalars, first in its numbers (see _decide)


@dataclass
class PendingDecision:
    tensors: dict[str, torch.Tensor]
    mode: DecisionMode
    settings: SamplingSettings
    stages: tuple[tuple[str, str], ...]  # (name, detail) of each active stage
    u: float | None
    timer: DeviceTimer
    pinned: tuple[int, ...] = ()

    def read(self, host: dict[str, np.ndarray], piece: Callable[[int], str]) -> Decision:
        """The Decision, from the host copies of `tensors`."""
        watch_all = host["decision.watch"].tolist()
        first = [i for i, token in enumerate(watch_all) if token not in watch_all[:i]]
        watch_ids = [watch_all[i] for i in first]
        w, numbers = len(watch_all), host["decision.numbers"]
        scalars, raw_probs = numbers[:SCALARS].tolist(), numbers[SCALARS : SCALARS + w]
        chosen, chosen_prob, chosen_rank, raw_rank, raw_prob, low, high, finite, any_left = scalars
        if not finite:
            raise TokenvizError(NOT_A_NUMBER)
        if not any_left:
            raise TokenvizError(NOTHING_ALLOWED)
        stage_rows = numbers[SCALARS + w :].reshape(len(self.stages), 3 + 2 * w)
        stages = tuple(
            Stage(
                name=name,
                detail=detail,
                kept=int(row[0]),
                mass=float(row[1]),
                probs=tuple(float(p) for p in row[3 : 3 + w][first]),
                changed=int(row[2]),
                changed_watched=tuple(bool(c) for c in row[3 + w :][first]),
            )
            for (name, detail), row in zip(self.stages, stage_rows)
        )
        return Decision(
            mode=self.mode,
            settings=self.settings,
            watch=tuple((i, piece(i)) for i in watch_ids),
            raw_probs=tuple(raw_probs[first].tolist()),
            stages=stages,
            u=self.u,
            band=(low, high) if self.mode == "sampled" else None,
            chosen_id=int(chosen),
            chosen_text=piece(int(chosen)),
            chosen_prob=chosen_prob,
            chosen_rank=int(chosen_rank),
            raw_rank=int(raw_rank),
            raw_prob=raw_prob,
            ms=self.timer.ms(),
            pinned=read_pinned(
                host["decision.pinned"], self.pinned, piece, int(chosen) if self.mode == "greedy" else None
            )
            if self.pinned
            else (),
        )


def decide(
    logits: torch.Tensor,
    settings: SamplingSettings,
    context_ids: Sequence[int],
    generated_ids: Sequence[int],
    piece: Callable[[int], str],
    forced_id: int | None = None,
    pinned: Sequence[int] = (),
    allowed: torch.Tensor | None = None,
) -> Decision:
    """Run every stage on `logits` (vocab,) and choose the next token: one transfer to the host."""
    pending = decide_on_device(logits, settings, context_ids, generated_ids, forced_id, pinned, allowed)
    return pending.read(to_host(pending.tensors), piece)
