"""What the engine's on-demand views compute, as plain data: the logit lens and residual stream,
attribution, the cache check, branches, beam search and speculative decoding."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from tokenviz.contract.bounds import FAIL_FAST, MAX_LAYERS, MAX_TOKENS, Count, Finite, Flag, Id, NonNegative, Text
from tokenviz.contract.features import FeatureLabels, FeatureReadings


def lens_row_label(row: int) -> str:
    """A lens row's name, one numbering everywhere (the app, the page, --json, the docs): 'emb' for the
    embeddings, else the decoder layer it follows, counted from 0 as every view and --ablate count them
    (row i follows layer i - 1: 'L29' is a 30-layer model's last)."""
    return "emb" if row == 0 else f"L{row - 1}"


@dataclass(frozen=True)
class LensLayer:
    """One layer of the logit lens: what the model would predict if it stopped after this layer."""

    layer: int  # the row: 0 = the embeddings, i = after decoder layer i - 1 (lens_row_label names it)
    top: tuple[tuple[int, str, float], ...]  # (id, text, prob), best first
    chosen_rank: int  # 1-based rank of the token finally chosen
    chosen_prob: float
    residual_norm: float
    pinned: tuple[tuple[int, float], ...] = ()  # (rank, prob) of each watched token, as Inspection.pinned


@dataclass(frozen=True)
class LensAsk:
    """What a lens is asked (contract.engine.Lens): the context `ids`, the positions read (one pass for all),
    the token that followed each, the watched tokens followed too, and its rows (0: the embeddings, i: after
    layer i - 1; None: every one)."""

    ids: tuple[int, ...]
    positions: tuple[int, ...]
    chosen: tuple[int, ...]
    pinned: tuple[int, ...] = ()
    rows: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Inspection:
    """Inside one position: its embedding row, the position scheme and the logit lens."""

    position: int
    token_id: int
    token_text: str
    chosen_id: int  # the token that followed (or is pending) at this position
    embedding_head: tuple[float, ...]  # the first dimensions of the token's embedding row
    embedding_norm: float
    tied_embeddings: bool
    positions: str
    lens: tuple[LensLayer, ...]
    pinned: tuple[tuple[int, str], ...] = ()  # the watched tokens (id, text) the lens follows too

    @property
    def first_top1_layer(self) -> int | None:
        """The first layer from which the chosen token stays the lens's top-1."""
        return first_top1(self.lens)

    def holds(self, rows: Collection[int]) -> bool:
        """Whether the lens holds every one of `rows` (Inspection rows: 0 the embeddings)."""
        return set(rows) <= {row.layer for row in self.lens}

    def rows_of(self, rows: Collection[int]) -> tuple[LensLayer, ...]:
        """The lens's rows among `rows`, in order."""
        return tuple(row for row in self.lens if row.layer in rows)


def first_top1(rows: Sequence[LensLayer]) -> int | None:
    """The first of the lens's `rows` from which the chosen token stays top-1 through the last of them (of
    a view's rows alone, the first of those: a layer between two of them is not known)."""
    first = None
    for row in rows:
        top1 = row.chosen_rank == 1
        first = (row.layer if first is None else first) if top1 else None
    return first


AttributionMethod = Literal["loo", "grad"]
ATTRIBUTION_METHODS: tuple[AttributionMethod, ...] = ("loo", "grad")  # leave-one-out, gradient × input


@dataclass(frozen=True)
class Attribution:
    """How much each earlier token led to the token that followed `position` (see model/attribution)."""

    method: AttributionMethod
    position: Count  # the last position of the context: its next-token distribution is explained
    target_id: Id  # the token that followed
    target_text: Text
    logprob: Finite  # the target's log-probability in the raw distribution after the whole context
    # one per position 0..position; positive: raised the target's log-probability
    scores: Annotated[tuple[Finite, ...], FAIL_FAST, Field(max_length=MAX_TOKENS)]

    @property
    def largest(self) -> float:
        """The largest score by size (1 where every score is 0): the top of a shading or bar scale."""
        return max((abs(x) for x in self.scores), default=0.0) or 1.0

    def strongest(self, n: int) -> list[int]:
        """The positions of the `n` largest scores by size, largest first."""
        return sorted(range(len(self.scores)), key=lambda p: -abs(self.scores[p]))[:n]


@dataclass(frozen=True)
class LogitDifference:
    """logit(a) − logit(b) after `position`, split into the share of each part of the residual
    stream (direct logit attribution, see model/logit_difference): the shares add up to `total`."""

    position: Count
    a_id: Id
    a_text: Text
    b_id: Id
    b_text: Text
    total: Finite  # the model's own logit difference
    embedding: Finite  # the embeddings' share (with position embeddings and the model's embedding scale)
    attention: Annotated[tuple[Finite, ...], FAIL_FAST, Field(max_length=MAX_LAYERS)]  # each layer's attention's share
    mlp: Annotated[tuple[Finite, ...], FAIL_FAST, Field(max_length=MAX_LAYERS)]  # each layer's MLP's share
    bias: Finite  # the final norm's and the output layer's biases
    softcap: Finite  # what the final logit soft-capping changed (0 without one)

    @property
    def shares(self) -> float:
        """The sum of every share: the model's own logit difference, to rounding."""
        return self.embedding + sum(self.attention) + sum(self.mlp) + self.bias + self.softcap


@dataclass(frozen=True)
class Analyses:
    """The results computed on demand that a journey file keeps: those about its current path."""

    attributions: tuple[Attribution, ...] = ()
    logit_differences: tuple[LogitDifference, ...] = ()


@dataclass(frozen=True)
class StepDiff:
    """How two journeys' next-token distributions differ at one step (see journey/comparison)."""

    index: int
    kl: float  # bits: KL(A ‖ B) of the two raw distributions (the models' own, before any sampling stage)
    top1_agree: bool
    a_rank_of_b: int  # 1-based rank A's raw distribution gives B's chosen token (past A's last: A has no such id)
    b_rank_of_a: int  # and B's gives A's
    final_kl: float = 0.0  # bits: KL(A ‖ B) of the distributions the two draws are made from (inf: A keeps a
    # token B's stages removed)
    teacher_forced: bool = False  # after the paths parted: B's figures are B's on A's path, not on its own
    # llama-perplexity's figures of the step, B the base and A's chosen token the text's (decoding/
    # perplexity_statistics): NaN where not known (a served B gives no KLD; a token B's vocabulary lacks)
    nll_a: float = math.nan  # nats: -log p_A(A's token)
    nll_b: float = math.nan  # and -log p_B(A's token)
    kld: float = math.nan  # nats: KL(B ‖ A), llama-perplexity's KLD (over the tokens B gives more than e^-16)
    dp: float = math.nan  # Δp: p_A(A's token) - p_B(A's token)
    a_top: int = -1  # each model's most likely next token
    b_top: int = -1


@dataclass(frozen=True)
class Verification:
    """The pending step recomputed without the cache: the largest differences seen."""

    position: int
    max_logit_diff: float
    max_attention_diff: float
    argmax_agrees: bool
    compared_with: str = ""  # what the cache was compared with (the engine's recomputed_as)


@dataclass(frozen=True)
class CacheEvent:
    """What the last rewind or branch switch did to the KV cache."""

    kept: int  # positions kept: the shared prefix
    dropped: int


@dataclass(frozen=True)
class BranchSummary:
    """One path of the branch tree, summed up."""

    index: Annotated[int, Field(strict=True, ge=-1)]  # in the branch store; -1 for the current path
    text: Text  # the generated text
    tokens: Count  # generated tokens
    logprob: Annotated[
        float, Field(strict=True, le=0, allow_inf_nan=False)
    ]  # sum of the generated tokens' log-probabilities
    mean_entropy: NonNegative  # bits, over the steps taken
    shared: Count  # positions shared with the current path
    current: Flag


BeamFate = Literal["kept", "finished", "at length limit", "pruned"]  # finished: it ended with end of text


@dataclass(frozen=True)
class BeamCandidate:
    beam: int  # which beam it extends (0-based, in the previous step's order)
    id: int
    text: str
    token_logprob: float
    score: float  # accumulated log-probability of the whole continuation
    fate: BeamFate


@dataclass(frozen=True)
class BeamStep:
    index: int
    beams: tuple[tuple[tuple[int, ...], float], ...]  # the running beams before this step: (generated ids, score)
    candidates: tuple[BeamCandidate, ...]
    texts: tuple[str, ...] = ()  # the running beams' generated text, as `beams`


@dataclass(frozen=True)
class Hypothesis:
    ids: tuple[int, ...]  # generated ids
    text: str  # their pieces, joined
    logprob: float  # sum of the token log-probabilities
    score: float  # logprob / length ** length_penalty: what ranks the finished hypotheses
    end_of_text: bool = True  # False: cut at the length limit


@dataclass(frozen=True)
class BeamResult:
    width: int
    steps: tuple[BeamStep, ...]
    final: tuple[Hypothesis, ...]  # best first


@dataclass(frozen=True)
class Round:
    """One round of speculative decoding: the drafts, how many the target accepted, its own token."""

    drafted: tuple[int, ...]
    accepted: int  # how many of the drafted tokens the target accepted
    next_id: int  # the target's own token after them: the replacement, or a bonus if all were accepted
    rejected_at: int | None  # index in `drafted` of the first rejection


@dataclass(frozen=True)
class Speculation:
    drafter: str
    rounds: tuple[Round, ...]
    ids: tuple[int, ...]  # the generated tokens
    texts: dict[int, str]  # the text of every drafted or chosen token

    @property
    def drafted(self) -> int:
        return sum(len(r.drafted) for r in self.rounds)

    @property
    def acceptance_rate(self) -> float:
        return sum(r.accepted for r in self.rounds) / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return len(self.ids) / len(self.rounds) if self.rounds else 0.0


# What a view computes on demand (the answer to a Request, see contract.commands): a snapshot carries
# the newest of each kind.
ViewResult = (
    Inspection
    | Attribution
    | LogitDifference
    | Verification
    | BeamResult
    | Speculation
    | FeatureReadings
    | FeatureLabels
)


@dataclass(frozen=True)
class Drawn:
    """A token an engine drew itself (a server, with the settings sent as the request's fields), and
    the top of the distribution it returned with it: log-probabilities, as the server gave them."""

    chosen: int
    logprob: float  # the chosen token's, in the distribution the server returned
    rank: int  # 1-based, in that distribution (from the top returned, or asked for apart)
    top: tuple[tuple[int, float], ...]  # (id, logprob), best first: the top-N the server returned
    raw: bool  # the log-probabilities are the model's own, before the sampling settings
    ms: float  # the request's latency: what the step cost, not a forward pass
    finish: str | None = None  # why the server would stop here ("stop": end of sequence or a stop string)

    @property
    def known(self) -> dict[int, float]:
        """Every token whose log-probability the server gave: the top-N and the chosen one."""
        return {**dict(self.top), self.chosen: self.logprob}
