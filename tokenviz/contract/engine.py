"""The engine protocol: what the journey and the views ask of whatever runs the model.

A backend (the transformers one in tokenviz.backends.transformers, a model server's in
tokenviz.backends.served) declares what it can do as capabilities (`Capability`, kept in
ModelInfo.capabilities), each a protocol of its own that an engine implements or not, side by side:
`Engine` is what every engine does (the tokenizer's encode, decode and pieces; one step from the
tokens fed to the next-token distribution; crop and rewind; the model's description); beside it a
KV cache read and fed again (`Caching`), exact attention rows (`AttentionRows`), the logit lens
(`Lens`), attribution (`Attributing`), interventions (`Intervenable`) and the split of a logit
difference by layer (`LogitSplitting`). A served model with the lens and attention rows and no cache
here is as easy to say as a local model with every one.

The journey asks for a capability through `require` (or the view's `needs`, for a key): what the engine
lacks is one line saying so. Nothing here imports torch at run time: `Scores` (an engine's tensor of
scores, on its device) names torch's tensor for the type checker alone, and every engine module ends with
`conforms`, so mypy holds each engine to the protocols it declares.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Literal, Protocol, Self, TypeAlias, overload, runtime_checkable

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.interventions import Intervention
from tokenviz.contract.records import ModelInfo, Routing
from tokenviz.contract.results import BeamResult, Drawn, Inspection, LensAsk, LogitDifference, Speculation
from tokenviz.contract.settings import SamplingSettings

if TYPE_CHECKING:  # a type only: the contract imports no torch, numpy or transformers at run time
    import numpy as np
    import torch
    from transformers import PreTrainedTokenizerBase

Scores: TypeAlias = "torch.Tensor"  # an engine's scores, on its device (the caller moves them to the host)
Host: TypeAlias = "dict[str, np.ndarray]"  # a step's tensors on the host, by name (one transfer's)
IsCancelled: TypeAlias = "Callable[[], bool] | None"  # asked between units of work: True stops it
OnProgress: TypeAlias = "Callable[[int, int], None] | None"  # told (done, of) after each unit of work


class Capability(StrEnum):
    """One thing an engine can do; its value is how the model view and a refusal name it."""

    STEP = "step"  # tokenize, one step to the next-token distribution, crop and rewind
    CACHE = "kv cache"  # the cache's length and bytes; the logits after any position it holds
    ATTENTION = "attention rows"  # exact attention weights of any cached position
    LENS = "logit lens"  # each layer's residual read through the output head
    LEAVE_ONE_OUT = "leave-one-out"  # each context token's effect on a token, by scoring the context without it
    ATTRIBUTION = "attribution"  # gradient × input over the context (the model's weights)
    INTERVENTIONS = "interventions"  # steering and patching the residual stream (and ablating heads: ABLATION)
    ABLATION = "head ablation"  # a head's output zeroed or averaged: a hook inside the model's attention
    ROUTING = "routing"  # a mixture-of-experts model's router decisions
    LOGIT_SPLIT = "logit split"  # a logit difference split by layer (attention and MLP)
    TOKENIZER = "local tokenizer"  # the model's own tokenizer in this process (counting tokens)
    GRAMMAR = "grammar stage"  # a grammar's mask over the whole vocabulary, tokenviz drawing: the tokenizer here
    FULL_SCORES = "full scores of a text"  # every position's scores over the whole vocabulary, a pass of its own
    RESIDUAL = "residual stream"  # the residual after any layer at any position (what an SAE reads)


WHOLE_VOCABULARY = "the whole vocabulary, before the sampling settings"  # the transformers backend's distribution


@dataclass
class Elapsed:
    """Milliseconds work took that is already done (a request's, network included; a llama.cpp decode's),
    read as a device timer is (`wait().ms()`): the `timer` of such an engine's forward result."""

    milliseconds: float = 0.0

    def wait(self) -> Elapsed:
        return self

    def ms(self) -> float:
        return self.milliseconds


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens two paths share from the first: what a cache (or anything else that followed
    `a` token by token) can keep when it is brought to `b`."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def in_order(capabilities: Iterable[str]) -> tuple[str, ...]:
    """`capabilities` (values of Capability) in the enum's order, as the model view lists them."""
    held = set(capabilities)
    return tuple(c.value for c in Capability if c.value in held)


def refusal_of(info: ModelInfo, needed: Capability, what: str, brief: bool = False) -> str | None:
    """One line saying that `what` needs a capability this engine lacks; None when it has it. `brief`:
    short enough for a notification (the model view says why and what it gives)."""
    if needed.value in info.capabilities:
        return None
    if brief:
        return f"{what}: {why_not(info, needed)}"
    said = dict(info.lacks_why).get(needed.value)
    if said is not None:  # the runtime's own words: why it lacks it, and what gives it
        return f"{what} needs the engine's {needed.value}: {said}"
    held = ", ".join(info.capabilities) or "none"
    drawn = ""
    if needed is Capability.GRAMMAR and info.draws:  # a tokenizer here does not make the draw tokenviz's
        drawn = f": {info.giver} draws each token itself, and a grammar stage needs tokenviz to draw"
    return f"{what} needs the engine's {needed.value}, which {info.name} does not give{drawn} (it gives: {held})"


def why_not(info: ModelInfo, needed: Capability) -> str:
    """Why this engine lacks `needed`, and what would give it, in a few words for a notification (never
    the question back): the backend's own words where it gives them (ModelInfo.lacks_why)."""
    if needed is Capability.GRAMMAR and info.draws:
        return f"{info.giver} draws each token itself; a grammar needs tokenviz to draw (M says more)"
    said = dict(info.lacks_why).get(needed.value)
    if said is not None:  # an aside that ends it, as an install line, is left to the model view
        main, aside, _ = said.rpartition(" (") if said.endswith(")") else (said, "", "")
        return f"{main} (M says more)" if aside else said
    if needed is Capability.ROUTING and not info.experts:
        return f"{info.name} has no experts (a dense model): no routing to show"
    return f"{info.name} does not give its {needed.value} here (M lists what it gives)"


@dataclass(frozen=True)
class ChatIds:
    """A conversation through a model's chat template: its ids, and per id whether the template added it
    (not the user's or system's own words)."""

    ids: list[int]
    template: list[bool]


class Timer(Protocol):
    """How long a pass took, read once its work is done (a device timer; Elapsed for work already done)."""

    def wait(self) -> Timer:
        """Wait until the timed work is done."""

    def ms(self) -> float:
        """Milliseconds, read after the step's transfer."""


class TimesByPlace(Protocol):
    """A pass's time in each place a spread model's weights live."""

    def ms(self) -> tuple[tuple[str, float], ...]:
        """Milliseconds in each place, in the order the pass first reached it."""


class Forward(Protocol):
    """What one forward pass gave: the next-token scores after the last token fed (None where the
    distribution comes with the engine's own draw: a DrawingEngine's), its timer, a mixture-of-experts
    model's routing of the tokens fed and a spread model's time by place, where the model has them."""

    @property
    def logits(self) -> Scores | None: ...

    @property
    def timer(self) -> Timer: ...

    @property
    def routes(self) -> dict[str, Scores] | None: ...

    @property
    def places(self) -> TimesByPlace | None: ...

    def predictions(self, next_ids: Sequence[int]) -> dict[str, Scores]:
        """What the model predicted after each position fed, of `next_ids` (the columns of
        decoding.prompt_predictions); asked of a pass with `every_position`."""


def scores_of(forward: Forward) -> Scores:
    """The next-token scores a pass gave: an engine that draws its own token gives them with its draw,
    so asking a pass of one is the caller's mistake."""
    if forward.logits is None:
        raise TypeError("this engine's distribution comes with its own draw, not with a pass")
    return forward.logits


class Pieces(Protocol):
    """Token ids as text pieces, learnt in batches (a prompt's in one call); holds no engine."""

    def piece(self, token_id: int) -> str:
        """The text `token_id` adds (decoded once, kept): never raises for an id of the vocabulary."""

    def learn(self, ids: Iterable[int]) -> None:
        """Decode every one of `ids` not yet known, in one call."""


@runtime_checkable
class Engine(Protocol):
    """What every engine does (Capability.STEP): a model that tokenizes and steps. Not thread-safe: one
    thread owns it."""

    info: ModelInfo  # its description, capabilities included
    special_ids: set[int]
    eos_ids: set[int]

    @property
    def pieces(self) -> Pieces:
        """Its pieces (what a record's lazy prompt predictions keep: not the engine)."""

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The Hugging Face tokenizer the grammar engine (llguidance) and a comparison read (None without
        Capability.TOKENIZER)."""

    @property
    def device(self) -> torch.device:
        """Where its scores live: masks and chunk sizes follow it."""

    @property
    def cache(self) -> object:
        """What it has been fed, to go back to: opaque to all but the engine (see use_cache)."""

    def use_cache(self, cache: object) -> None:
        """Go on from `cache` (one this engine's `cache` gave before)."""

    def chat_ids(self, user: str, system: str | None = None) -> ChatIds:
        """The conversation through the model's chat template, and which ids it added."""

    def twin(self) -> Self:
        """Another engine on the same model, with a cache of its own."""

    def joined(self, last: Forward, routes: Sequence[dict[str, Scores]], places: Sequence[TimesByPlace]) -> Forward:
        """The last of several passes over one prompt (a prefill's chunks), with every pass's routing and
        time by place joined in order of position."""

    def read_routing(self, host: Host) -> Routing | None:
        """The routing in a step's transfer (None for a dense model)."""

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        """`text`'s token ids (with the model's special tokens, a BOS, where `special_tokens`)."""

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`, as the model's tokenizer decodes them together."""

    def piece(self, token_id: int) -> str:
        """The text one token adds (see Pieces.piece)."""

    def learn_pieces(self, ids: Iterable[int]) -> None:
        """Decode the pieces of `ids` in one call (see Pieces.learn)."""

    @property
    def kv_len(self) -> int:
        """How many tokens the engine has been fed (its cache's length, where it has one)."""

    @property
    def kv_bytes(self) -> int:
        """The bytes its KV cache holds here now (0: it keeps none here, as a server keeps its own)."""

    def reset(self) -> None:
        """Forget everything fed: the next forward starts a new context."""

    def crop(self, length: int) -> None:
        """Keep the first `length` tokens fed; the next forward goes on from there."""

    def forward(
        self, ids: list[int], every_position: bool = False, cancelled: IsCancelled = None, progress: OnProgress = None
    ) -> Forward:
        """Feed `ids` after what it holds: the next-token scores (`.logits`), and with
        `every_position` what it predicted after each of them (`.predictions(next_ids)`, the columns
        of decoding.prompt_predictions). An engine whose pass has layers asks `cancelled()` before
        each (True raises Cancelled, the caller undoing what the pass fed) and tells
        `progress(layer, layers)`. A failure it can name (a server's, a model's) is a TokenvizError
        of one line."""


class DenseInOnePlace:
    """Engine's routing and time by place for a model with neither: no router to read, one place, so a
    prompt's passes need no joining (an engine that runs its model elsewhere, or whole, inherits it)."""

    def joined(self, last: Forward, routes: Sequence[dict[str, Scores]], places: Sequence[TimesByPlace]) -> Forward:
        return last

    def read_routing(self, host: Host) -> Routing | None:
        return None


@runtime_checkable
class DrawingEngine(Engine, Protocol):
    """An engine that draws the next token itself, with the settings sent to it (a model server). Its
    distribution is the top-N it returns (`forward` feeds tokens without a request); the stages shown
    beside its draw are recomputed over that top-N. Its scores are a Drawn: its interventions' own_logits
    give the model's own top-N so."""

    top_n: int  # log-probabilities asked for at each step
    raw: bool | None  # its log-probabilities are the model's own, before the settings (None: not measured yet)

    def draw(self, ids: Sequence[int], settings: SamplingSettings) -> Drawn:
        """The engine's next token after `ids`, drawn with `settings`."""

    def logprob_of(self, ids: Sequence[int], token: int) -> tuple[float, int]:
        """(log-probability, 1-based rank) of `token` after `ids` (a forced token outside the top-N)."""


@dataclass(frozen=True)
class SearchAsk:
    """What a search from the journey asks of an engine's cache (beam search, speculative decoding):
    `steps` new tokens after `ids`; with `from_cache`, the engine's cache holds `ids[:-1]` and a copy of
    it may be the start; `cancelled` is asked and `progress` told between the search's units of work."""

    ids: tuple[int, ...]
    steps: int
    from_cache: bool = False
    cancelled: IsCancelled = None
    progress: OnProgress = None

    def is_cancelled(self) -> bool:
        return self.cancelled is not None and self.cancelled()

    def tell(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)


@runtime_checkable
class Caching(Protocol):
    """Capability.CACHE: a KV cache that can be read and fed again (verify, watching past steps, beams
    and speculation from it)."""

    # What `recompute` runs, in words (the cache view says what verify compared the cache with).
    recomputed_as: str

    def logits_after(self, ids: Sequence[int], start: int) -> Scores:
        """The next-token scores after each of `ids[start:]`, the cache left as it was."""

    def beam_search(self, ask: SearchAsk, width: int) -> BeamResult:
        """Beam search of `width` beams from `ask.ids` (a BeamResult)."""

    def speculate(
        self, ask: SearchAsk, drafter: str, settings: SamplingSettings, draft: Engine | None = None
    ) -> Speculation:
        """Speculative decoding from `ask.ids` (a Speculation), drafted as `drafter` names."""

    def recompute(
        self, ids: list[int], chunk: int | None = None, progress: OnProgress = None, cancelled: IsCancelled = None
    ) -> tuple[Scores, Scores]:
        """The whole of `ids` again without the cache: (next-token scores, last row of every layer)."""


@runtime_checkable
class FullScores(Protocol):
    """Capability.FULL_SCORES: a text scored alone, as llama-perplexity scores a window of it."""

    def full_scores(self, ids: Sequence[int], first: int) -> Scores:
        """One pass over `ids` alone at positions from 0, in a cache of its own (the journey's as it was):
        the next-token scores over the whole vocabulary after each of `ids[first:]`, (rows, vocab) float32;
        the last layer computed at those positions alone where the runtime does so (llama.cpp)."""


@dataclass(frozen=True)
class Residuals:
    """What a lens reads at some positions of a text scored alone, kept from the scoring pass itself
    (LensOfScores): each layer's residual there as the engine's lens reads it (`stream`: (rows, positions,
    hidden), the engine's own layout), the token at each position and the engine's own scores there (the
    lens's last row). Opaque to the journey, which keeps a few positions (`at`) and hands them back."""

    stream: Scores
    tokens: tuple[int, ...]
    scores: Scores  # (positions, vocab)

    def at(self, places: Sequence[int]) -> Residuals:
        """Those at these positions alone (indices into this one's)."""
        return Residuals(self.stream[:, list(places)], tuple(self.tokens[p] for p in places), self.scores[list(places)])


@runtime_checkable
class LensOfScores(Protocol):
    """A FullScores engine with a lens whose scoring pass can keep what the lens reads, so the lens at a few
    scored positions (a text's tails, journey.against_base) costs no pass of its own."""

    def full_scores_kept(self, ids: Sequence[int], first: int) -> tuple[Scores, Residuals]:
        """full_scores, and the Residuals at the same positions (after each of `ids[first:]`)."""

    def lens_of(self, kept: Residuals, chosen: Sequence[int]) -> list[Inspection]:
        """The lens at each position `kept` holds, as `inspect` gives it (every row), `chosen[i]` the token
        that followed it."""


@runtime_checkable
class OwnGrammarVocabulary(Protocol):
    """An engine whose vocabulary the grammar engine reads from the runtime that runs its model, not from a
    Hugging Face tokenizer (a GGUF in llama.cpp: llguidance reads llama.cpp's vocabulary itself)."""

    def grammar_vocabulary(self) -> object:
        """The vocabulary as llguidance reads it (an LLTokenizer: the contract names no grammar engine)."""


@runtime_checkable
class AttentionRows(Protocol):
    """Capability.ATTENTION: exact attention weights of any position of the journey."""

    def attention(
        self, ids: Sequence[int], rows: range, layers: Sequence[int], cancelled: IsCancelled = None
    ) -> Scores:
        """Exact attention weights of positions `rows` for `layers`: (layers, heads, rows, keys), the
        model's own softmax over the keys up to each row (0 past it). `cancelled()` True (a key waits) stops
        the pass where the runtime can stop it, raising Cancelled."""


class Intervening(Protocol):
    """The interventions in force on an engine's model, with the model's own passes beside them."""

    interventions: tuple[Intervention, ...]

    def own_logits(self, ids: Sequence[int]) -> tuple[Scores | Drawn, Timer]:
        """The model's own next-token scores after `ids` (a DrawingEngine's own draw), and the pass's timer."""

    def suspended(self) -> AbstractContextManager[None]:
        """The model without these interventions, inside the block."""

    def remove(self) -> None:
        """Take every hook off the model: it runs as it would without them."""


@runtime_checkable
class ResidualStream(Protocol):
    """Capability.RESIDUAL: the residual stream after a decoder layer, as the model computes it."""

    def residual(self, ids: Sequence[int], positions: Sequence[int], layer: int) -> Scores:
        """The residual after decoder layer `layer` at `positions` of `ids` (len(positions), hidden), with the
        interventions in force, from as few passes as the runtime needs (one, up to the last position)."""

    def through_head(self, vectors: Scores) -> Scores:
        """`vectors` (n, hidden) through the model's final norm and output head as the runtime applies them:
        (n, vocab) float32 logits (an SAE feature's decoder row read as a lens reads a residual)."""


@runtime_checkable
class Lens(Protocol):
    """Capability.LENS: each layer's residual read through the output head."""

    def inspect(self, ask: LensAsk) -> list[Inspection]:
        """Each asked position's Inspection (embedding, residual norms, logit lens), one pass for all."""


@runtime_checkable
class Attributing(Protocol):
    """Capability.LEAVE_ONE_OUT, and with the model's weights Capability.ATTRIBUTION (gradient × input)."""

    def attribute(
        self, ids: list[int], target: int, method: str, progress: OnProgress = None, cancelled: IsCancelled = None
    ) -> tuple[float, list[float]]:
        """log p(target | ids) and each token's attribution to it."""


@runtime_checkable
class LogitSplitting(Protocol):
    """Capability.LOGIT_SPLIT: a logit difference split by layer."""

    def logit_difference(
        self, ids: list[int], a: int, b: int, progress: OnProgress = None, cancelled: IsCancelled = None
    ) -> LogitDifference:
        """logit(a) − logit(b) after `ids`, split by layer."""


@runtime_checkable
class Intervenable(Protocol):
    """Capability.INTERVENTIONS: heads ablated, the residual stream steered or patched."""

    def intervene(
        self, interventions: Sequence[Intervention], context: Sequence[int], token_id: Callable[[str], int]
    ) -> Intervening:
        """The interventions resolved (a mean ablation over `context`) and hooked into the model."""


PROTOCOLS: dict[Capability, type] = {  # what an engine declaring each capability implements
    Capability.STEP: Engine,
    Capability.CACHE: Caching,
    Capability.ATTENTION: AttentionRows,
    Capability.LENS: Lens,
    Capability.LEAVE_ONE_OUT: Attributing,
    Capability.ATTRIBUTION: Attributing,
    Capability.INTERVENTIONS: Intervenable,
    Capability.ABLATION: Intervenable,
    Capability.ROUTING: Engine,  # read from the passes it runs anyway: Engine.read_routing
    Capability.LOGIT_SPLIT: LogitSplitting,
    Capability.TOKENIZER: Engine,  # its `tokenizer`, which an engine without this capability leaves None
    Capability.GRAMMAR: Engine,  # its `tokenizer`, and the logits tokenviz draws from
    Capability.FULL_SCORES: FullScores,
    Capability.RESIDUAL: ResidualStream,
}


# The capabilities one protocol serves (the `require` overloads name them once).
ExplainingNeeds: TypeAlias = Literal[Capability.LEAVE_ONE_OUT, Capability.ATTRIBUTION]
InterveningNeeds: TypeAlias = Literal[Capability.INTERVENTIONS, Capability.ABLATION]
EngineNeeds: TypeAlias = Literal[Capability.STEP, Capability.ROUTING, Capability.TOKENIZER, Capability.GRAMMAR]


@overload
def require(engine: Engine, needed: Literal[Capability.CACHE], what: str) -> Caching: ...
@overload
def require(engine: Engine, needed: Literal[Capability.ATTENTION], what: str) -> AttentionRows: ...
@overload
def require(engine: Engine, needed: Literal[Capability.LENS], what: str) -> Lens: ...
@overload
def require(engine: Engine, needed: ExplainingNeeds, what: str) -> Attributing: ...
@overload
def require(engine: Engine, needed: InterveningNeeds, what: str) -> Intervenable: ...
@overload
def require(engine: Engine, needed: Literal[Capability.LOGIT_SPLIT], what: str) -> LogitSplitting: ...
@overload
def require(engine: Engine, needed: Literal[Capability.FULL_SCORES], what: str) -> FullScores: ...
@overload
def require(engine: Engine, needed: Literal[Capability.RESIDUAL], what: str) -> ResidualStream: ...
@overload
def require(engine: Engine, needed: EngineNeeds, what: str) -> Engine: ...


def require(engine: Engine, needed: Capability, what: str) -> object:
    """`engine` as the protocol `needed` names (PROTOCOLS); a TokenvizError of one line (`refusal_of`) where
    it does not declare it, or declares it without implementing it (a backend's mistake, said so)."""
    line = refusal_of(engine.info, needed, what)
    if line is not None:
        raise TokenvizError(line)
    if not isinstance(engine, PROTOCOLS[needed]):
        raise TokenvizError(f"{what}: {engine.info.name}'s backend declares its {needed.value} without giving it")
    return engine
