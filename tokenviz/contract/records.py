"""Plain-data records of the journey: what the UI, the trace and the tests read.

Nothing here holds a torch tensor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import Field, GetPydanticSchema, PlainSerializer, PlainValidator, SerializationInfo, ValidationInfo
from pydantic.types import Base64Bytes

from tokenviz.contract.bounds import (
    FAIL_FAST,
    INTERVENTION_SETS,
    MAX_CANDIDATES,
    MAX_EXPERTS_PER_TOKEN,
    MAX_FOLLOWED,
    MAX_LAYERS,
    MAX_PLACES,
    MAX_STAGES,
    MAX_TOKENS,
    Count,
    Finite,
    Flag,
    Id,
    NonNegative,
    Place,
    Positive,
    Probability,
    Text,
    replaced,
    row,
)
from tokenviz.contract.interventions import Intervention
from tokenviz.contract.settings import SavedSettings
from tokenviz.contract.text import safe_text

DecisionMode = Literal["greedy", "sampled", "forced", "drawn"]  # drawn: by the engine itself (a server)
REPETITION, PRESENCE_FREQUENCY = "repetition", "presence/frequency"  # the stages that penalise tokens
PENALTY_STAGES = (REPETITION, PRESENCE_FREQUENCY)
GRAMMAR = "grammar"  # the stage that keeps only the tokens a grammar allows
MAX_PINNED = 4  # tokens watched at once


@row("id", "text", "logit", "prob")
@dataclass(frozen=True)
class Candidate:
    """One vocabulary entry as the model scored it."""

    id: Id
    text: Text
    logit: Finite  # a served model's: its log-probability
    prob: Probability


Candidates = Annotated[tuple[Candidate, ...], FAIL_FAST, Field(max_length=MAX_CANDIDATES)]
Followed = Annotated[tuple[Probability, ...], FAIL_FAST, Field(max_length=MAX_FOLLOWED)]  # one per watched token


@dataclass(frozen=True)
class Unsteered:
    """With interventions on: the model's own distribution at a step's context (its top candidates)
    and KL(intervened ‖ own) in bits: exact, or its floor where only two top-Ns are known (a server's)."""

    top: Candidates
    kl: NonNegative
    ms: NonNegative = field(default=0.0, compare=False)  # the own pass's time: what keeping it costs a step
    kl_floor: Flag = False  # the KL is a least value (decoding.drawn.kl_floor), not the whole vocabulary's


@row("name", "detail", "kept", "mass", "probs")
@dataclass(frozen=True)
class Stage:
    """The distribution after one sampling stage.

    `kept` counts the tokens still possible; `mass` is the share of the previous stage's
    probability those tokens held; `probs` follows `Decision.watch` (one probability each).
    """

    name: Text
    detail: Text
    kept: Count
    mass: Probability
    probs: Followed
    # The tokens whose score this stage changed (a penalty: those it penalised), and which of the
    # watched ones; not saved in journey files, so not part of a stage's identity.
    changed: int = field(default=0, compare=False)
    changed_watched: tuple[bool, ...] = field(default=(), compare=False)

    @property
    def is_penalty(self) -> bool:
        return self.name in PENALTY_STAGES

    @property
    def is_grammar(self) -> bool:
        return self.name == GRAMMAR

    @property
    def removed(self) -> float:
        """The share of the previous stage's probability on the tokens this stage ruled out."""
        return max(1.0 - self.mass, 0.0)


@row("id", "text", "prob", "final_prob", "rank")
@dataclass(frozen=True)
class PinnedToken:
    """A token the user follows, as the model and the sampling settings saw it at one step."""

    id: Id
    text: Text
    prob: Probability  # in the model's raw distribution
    final_prob: Probability  # after every stage: the probability of being taken (one-hot when greedy)
    rank: Positive  # 1-based, in the raw distribution


@dataclass(frozen=True)
class Decision:
    """How the next token was decided: every stage, the draw, the choice."""

    mode: DecisionMode
    settings: SavedSettings  # the settings in force
    # tokens followed through the stages: (id, text)
    watch: Annotated[tuple[tuple[Id, Text], ...], FAIL_FAST, Field(max_length=MAX_FOLLOWED)]
    raw_probs: Followed  # the model's own softmax for each watched token
    stages: Annotated[tuple[Stage, ...], FAIL_FAST, Field(max_length=MAX_STAGES)]
    u: Annotated[float, Field(strict=True, ge=0.0, lt=1.0)] | None  # the uniform draw (None when greedy or forced)
    band: tuple[Probability, Probability] | None  # cumulative band of the chosen token holding u
    chosen_id: Id
    chosen_text: Text
    chosen_prob: Probability  # probability in the final distribution
    chosen_rank: Positive  # 1-based rank in the final distribution
    raw_rank: Positive  # 1-based rank in the model's raw distribution
    raw_prob: Probability
    ms: NonNegative = field(default=0.0, compare=False)  # timing is not part of the decision
    # the tokens the user follows (see Session.pin)
    pinned: Annotated[tuple[PinnedToken, ...], FAIL_FAST, Field(max_length=MAX_PINNED)] = ()

    @property
    def pinned_ids(self) -> tuple[int, ...]:
        return tuple(p.id for p in self.pinned)

    @property
    def greedy(self) -> bool:
        """Whether argmax took the token (here, or a server's under greedy settings): its final
        distribution is one-hot."""
        return self.mode == "greedy" or (self.mode == "drawn" and self.settings.greedy)

    @property
    def final_prob(self) -> float:
        """The probability the chosen token had of being taken: 1 where argmax took it."""
        return 1.0 if self.greedy else self.chosen_prob

    @property
    def final_by_id(self) -> dict[int, float]:
        """final_probs by token id: each watched token's probability of being taken."""
        return dict(zip((token_id for token_id, _ in self.watch), self.final_probs, strict=True))

    @property
    def final_probs(self) -> tuple[float, ...]:
        """The probability each watched token had of being taken: after the last stage, or one-hot
        for greedy (argmax takes the top token with certainty)."""
        if self.greedy:
            return tuple(1.0 if token_id == self.chosen_id else 0.0 for token_id, _ in self.watch)
        return self.stages[-1].probs if self.stages else self.raw_probs


@row("position", "top", "entropy", "next_id", "next_text", "next_prob", "next_rank")
@dataclass(frozen=True)
class PromptPrediction:
    """What the model predicted after one prompt token: the prefill computes it at every position.

    `next_*` is about the prompt's own next token: how likely, and how highly ranked, the model found it.
    """

    position: Count
    top: Candidates  # the raw top candidates, best first
    entropy: NonNegative  # bits
    next_id: Id
    next_text: Text
    next_prob: Probability
    next_rank: Positive  # 1-based
    # The natural log of next_prob, computed as a log-softmax (exact where the probability is tiny);
    # journey files do not keep it, so it is not part of a prediction's identity.
    next_logprob: float | None = field(default=None, compare=False)

    @property
    def logprob(self) -> float:
        return self.next_logprob if self.next_logprob is not None else math.log(max(self.next_prob, 1e-300))

    @property
    def surprisal(self) -> float:
        """-log2 of the next token's probability, in bits."""
        return -self.logprob / math.log(2)


@dataclass(frozen=True)
class LayerRoute:
    """One MoE layer's choice for one token: its experts and their weights as the router returned
    them, and the router's entropy (bits) over all its experts."""

    layer: int
    experts: tuple[int, ...]
    weights: tuple[float, ...]
    entropy: float
    shared: float | None = None  # the shared expert's weight (its gate's), where the layer has one


@dataclass(frozen=True)
class Routing:
    """The routing of every position a forward pass fed, kept compact: a few bytes per layer and
    position (experts as uint16, weights and entropies as float32, position-major), so a long
    journey costs what its length costs. See tokenviz.backends.transformers.routing."""

    layers: Annotated[
        tuple[Count, ...], FAIL_FAST, Field(min_length=1, max_length=MAX_LAYERS)
    ]  # the MoE layers, in order
    k: Annotated[int, Field(strict=True, ge=1, le=MAX_EXPERTS_PER_TOKEN)]  # experts per token
    positions: Annotated[int, Field(strict=True, ge=1, le=MAX_TOKENS)]
    experts: Base64Bytes  # a file keeps the bytes as base64
    weights: Base64Bytes
    entropy: Base64Bytes
    shared: Base64Bytes = b""  # float32 (positions, layers): NaN where a layer has no shared expert

    def at(self, i: int) -> tuple[LayerRoute, ...]:
        """The routing of the i-th position fed (negative: from the end)."""
        i = i % self.positions
        n, k = len(self.layers), self.k
        experts = memoryview(self.experts).cast("H")[i * n * k : (i + 1) * n * k].tolist()  # no copy of the rest
        weights = memoryview(self.weights).cast("f")[i * n * k : (i + 1) * n * k].tolist()
        entropy = memoryview(self.entropy).cast("f")[i * n : (i + 1) * n].tolist()
        shared = memoryview(self.shared).cast("f")[i * n : (i + 1) * n].tolist() if self.shared else [math.nan] * n
        return tuple(
            LayerRoute(
                layer,
                tuple(experts[j * k : (j + 1) * k]),
                tuple(weights[j * k : (j + 1) * k]),
                entropy[j],
                None if math.isnan(shared[j]) else shared[j],
            )
            for j, layer in enumerate(self.layers)
        )


def _interventions_read(index: object, info: ValidationInfo) -> tuple[Intervention, ...]:
    """A file names a record's interventions by their index in its list of sets (each set once)."""
    if index is None:
        return ()
    sets = (info.context or {}).get(INTERVENTION_SETS, ())
    if type(index) is not int or not 0 <= index < len(sets):
        raise ValueError(f"names intervention set {index!r:.20}; the file holds {len(sets)}")
    return tuple(sets[index])


def _interventions_saved(interventions: tuple[Intervention, ...], info: SerializationInfo) -> int | None:
    """The index of `interventions` in the file's list of sets, added there where new."""
    if not interventions:
        return None
    sets: list[tuple[Intervention, ...]] = (info.context or {})[INTERVENTION_SETS]
    if interventions not in sets:
        sets.append(interventions)
    return sets.index(interventions)


# A file's predictions are a tuple (the prefill's are a sequence that makes each when read).
READ_AS_TUPLE = GetPydanticSchema(lambda _, handler: handler(tuple[PromptPrediction, ...]))
SavedInterventions = Annotated[
    tuple[Intervention, ...],
    PlainValidator(_interventions_read, json_schema_input_type=int | None),
    PlainSerializer(_interventions_saved, return_type=int | None),
]


@dataclass(frozen=True)
class StepRecord:
    """One forward pass and the decision taken on its output.

    Index 0 is the prefill (the whole prompt block); index i > 0 fed one token, the one chosen at
    step i - 1. `position` is the sequence position of the token being predicted.
    """

    index: Count
    position: Count
    input_ids: Annotated[tuple[Id, ...], FAIL_FAST, Field(max_length=MAX_TOKENS)]
    input_texts: Annotated[tuple[Text, ...], FAIL_FAST, Field(max_length=MAX_TOKENS)]
    top: Candidates
    entropy: NonNegative  # bits, of the model's raw distribution
    decision: Decision
    forward_ms: NonNegative = field(default=0.0, compare=False)
    # A model spread by a device map: the forward pass's ms in each place its weights live ('cuda:0',
    # 'cpu', 'disk'), in the order the pass reached them.
    place_ms: Annotated[tuple[tuple[Place, NonNegative], ...], FAIL_FAST, Field(max_length=MAX_PLACES)] = field(
        default=(), compare=False
    )
    kv_len: Count = 0
    kv_bytes: Count = 0
    # The prefill's: one per prompt position but the last (a sequence that makes each when read).
    prompt_predictions: Annotated[
        Sequence[PromptPrediction], READ_AS_TUPLE, FAIL_FAST, Field(max_length=MAX_TOKENS)
    ] = ()
    routing: Routing | None = field(default=None, compare=False)  # of each input position (an MoE model's)
    interventions: SavedInterventions = ()  # in force when its forward pass ran
    unsteered: Unsteered | None = None  # with interventions: the model's own distribution there

    @property
    def saturated(self) -> bool:
        """The interventions left every top logit equal where the model's own differ: a steering so
        strong (a scale of 1e30) that the residual drowns and the distribution is flat."""
        if self.unsteered is None or len(self.top) < 2:
            return False
        flat = len({c.logit for c in self.top}) == 1
        return flat and len({c.logit for c in self.unsteered.top}) > 1


@row("id", "text", "is_prompt", "is_special", "is_template")
@dataclass(frozen=True)
class TokenChip:
    """A token of the sequence as the tokens pane shows it."""

    id: Id
    text: Text
    is_prompt: Flag
    is_special: Flag
    is_template: Flag = False  # added by the chat template around the messages


@dataclass(frozen=True)
class ModelInfo:
    name: Text
    device: Text
    dtype: Text
    # 0 where the engine does not expose them (a served model)
    layers: Annotated[int, Field(strict=True, ge=0, le=MAX_LAYERS)]
    heads: Annotated[int, Field(strict=True, ge=0, le=4096)]
    kv_heads: Annotated[int, Field(strict=True, ge=0, le=4096)]
    head_dim: Annotated[int, Field(strict=True, ge=0, le=65536)]
    hidden: Count
    vocab: Annotated[int, Field(strict=True, ge=1, le=100_000_000)]
    context: Positive
    architecture: Text
    tied_embeddings: Flag
    positions: Text  # "rotary (base 100000)" or "learned absolute (1024 positions)"
    attention: Text = "eager"  # how the forward passes compute attention (see tokenviz.backends.transformers.attention)
    chat_template: Flag = False  # the tokenizer has one: prompts can be chat messages
    memory: Text = ""  # what it needs of what was free when it loaded (see tokenviz.backends.transformers.memory)
    placement: Text = ""  # with a device map: which layers live on which device or the disk, and their bytes
    quantization: Text = ""  # how the weights are quantized ('' when they are not)
    queries_kept: Text = ""  # how many positions' query states the attention view keeps (see model.query_store)
    compiled: Text = ""  # with --compile: how the decode step runs (see model.compiled_step); '' when it is not
    # Multi-head latent attention (DeepSeek V2/V3 and their kin): the cache keeps one compressed latent
    # per position, expanded into every head's keys and values in each layer; kv_heads and head_dim are the latent's.
    latent_kv: Flag = False
    # routed experts in each mixture-of-experts layer (0: a dense model, or recorded before it was kept)
    experts: Annotated[int, Field(strict=True, ge=0, le=65_535)] = 0
    # What the engine running it can do (values of contract.engine.Capability; none: a recording) and
    # what its next-token distribution covers (see contract.engine), in words.
    capabilities: Annotated[tuple[Text, ...], Field(max_length=64)] = ()
    distribution: Text = ""
    internals: Text = ""  # a served model's: why the internals it lacks are lacking, and how to have them
    # What the runtime says of a capability it lacks: (its value, why, and what gives it), for the refusal
    # to name the runtime, not the model ("llama.cpp computes a layer's heads together...").
    lacks_why: Annotated[tuple[tuple[Text, Text], ...], Field(max_length=32)] = ()
    # Said as data, for the views, the page, the document and the table to read (none asks which backend):
    runtime: Text = ""  # what computes the numbers: "transformers 4.57 (PyTorch 2.13)", "llama.cpp (...)", "vLLM ..."
    # The CPU threads a runtime that takes --threads runs with (0: it takes none): a step far slower than its
    # best says so and names --threads (llama.cpp's threads spin while they wait for each other).
    threads: Annotated[int, Field(strict=True, ge=0, le=4096)] = 0
    # What one step is, where it is not a pass in this process: a request, and whom it goes to ("the server at
    # HOST"); its time is then the request's, network included, and the cache is the one who answers it.
    requests: Text = ""
    numbers_of: Text = ""  # whose numbers a step's are, where not the model's own ("the server")
    reopen: Text = ""  # the command that opens this model live again, as its backend writes it
    # What the model view shows of it beyond what every model has, as its backend says it: (name, value) rows
    # ("each step": one request...; what a server's plugin reads inside it).
    details: Annotated[tuple[tuple[Text, Text], ...], Field(max_length=16)] = ()
    # Nats within which a journey re-run on it gives each chosen token's recorded log-probability, where its
    # recording is all its numbers (a server's: its file is checked whole); None: its tokens and routes.
    reproduced_within: Annotated[float, Field(strict=True, ge=0.0, le=1.0)] | None = None
    # each step's distribution: 0, the whole vocabulary; N, the top N the engine returns
    covers: Annotated[int, Field(strict=True, ge=0, le=100_000)] = 0
    draws: Text = ""  # who draws each token: "" tokenviz, from these numbers; else who does ("the server")

    def made_safe(self) -> ModelInfo:
        """Every text of it safe to print (safe_text): an engine's own (a plugin's) is said as it is built,
        never validated as a file's is."""
        texts: dict[str, object] = {k: safe_text(v) for k, v in self.__dict__.items() if isinstance(v, str)}
        texts["capabilities"] = tuple(safe_text(c) for c in self.capabilities)
        texts["lacks_why"] = tuple((safe_text(c), safe_text(why)) for c, why in self.lacks_why)
        texts["details"] = tuple((safe_text(name), safe_text(value)) for name, value in self.details)
        return replaced(self, texts)

    @property
    def giver(self) -> str:
        """Whose numbers a top N is, in a phrase: "the server" for a served model, else its name."""
        return self.numbers_of or self.name
