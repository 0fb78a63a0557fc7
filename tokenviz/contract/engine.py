"""The engine protocol: what the journey and the views ask of whatever runs the model.

A backend (the transformers one in tokenviz.backends.transformers, a model server's in
tokenviz.backends.served) declares what it can do as
capabilities, in three tiers:

- *engine*: the tokenizer's encode, decode and pieces; one step from the tokens fed to the
  next-token distribution; crop and rewind; the model's description (ModelInfo);
- *cached*: a KV cache whose length and bytes can be read, the logits after any position it holds
  (verify, watching past steps, beams, speculation), exact attention rows;
- *internals*: the logit lens, attribution by gradient or leave-one-out, interventions, routing,
  the split of a logit difference by layer.

The views name the capability they need (tokenviz.journey.views); a key whose view needs one the
engine lacks says so in one line. Nothing here imports torch: the scores an engine returns are its
own tensors, opaque to the contract (`Scores`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from enum import StrEnum
from typing import Any, Protocol, Self, runtime_checkable

from tokenviz.contract.interventions import Intervention
from tokenviz.contract.records import ModelInfo
from tokenviz.contract.results import BeamResult, Drawn, Speculation
from tokenviz.contract.settings import SamplingSettings

Scores = Any  # a backend's tensor of next-token scores (a torch tensor for the transformers backend)


class Capability(StrEnum):
    """One thing an engine can do; its value is how the model view and a refusal name it."""

    STEP = "step"  # tokenize, one step to the next-token distribution, crop and rewind
    CACHE = "kv cache"  # the cache's length and bytes; the logits after any position it holds
    ATTENTION = "attention rows"  # exact attention weights of any cached position
    LENS = "logit lens"  # each layer's residual read through the output head
    LEAVE_ONE_OUT = "leave-one-out"  # each context token's effect on a token, by scoring the context without it
    ATTRIBUTION = "attribution"  # gradient × input over the context (the model's weights)
    INTERVENTIONS = "interventions"  # ablating heads, steering and patching the residual stream
    ROUTING = "routing"  # a mixture-of-experts model's router decisions
    LOGIT_SPLIT = "logit split"  # a logit difference split by layer (attention and MLP)


ENGINE = frozenset({Capability.STEP})  # (a served model adds leave-one-out: a request per token)
CACHED = ENGINE | {Capability.CACHE, Capability.ATTENTION}
INTERNALS = CACHED | {
    Capability.LENS,
    Capability.LEAVE_ONE_OUT,
    Capability.ATTRIBUTION,
    Capability.INTERVENTIONS,
    Capability.ROUTING,
    Capability.LOGIT_SPLIT,
}
TIERS = (("engine", ENGINE), ("cached", CACHED), ("internals", INTERNALS))
WHOLE_VOCABULARY = "the whole vocabulary, before the sampling settings"  # the transformers backend's distribution


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


def tier_of(capabilities: Iterable[str]) -> str:
    """The highest tier whose every capability is held ('' if not even the engine's)."""
    held = set(capabilities)
    return next((name for name, tier in reversed(TIERS) if {c.value for c in tier} <= held), "")


def lacking(info: ModelInfo, needed: Capability, what: str, brief: bool = False) -> str | None:
    """One line saying that `what` needs a capability this engine lacks; None when it has it. `brief`:
    short enough for a notification (the model view says why and what it gives)."""
    if needed.value in info.capabilities:
        return None
    if brief:
        return f"{what} needs the {needed.value}: not on {info.name} (M says why)"
    held = ", ".join(info.capabilities) or "none"
    served = f", a served model: {info.internals or 'its server does not expose it'}" if info.top_only else ""
    return f"{what} needs the engine's {needed.value}, which {info.name} does not give{served} (it gives: {held})"


class Pieces(Protocol):
    """Token ids as text pieces, learnt in batches (a prompt's in one call); holds no engine."""

    def piece(self, token_id: int) -> str:
        """The text `token_id` adds (decoded once, kept): never raises for an id of the vocabulary."""

    def learn(self, ids: Iterable[int]) -> None:
        """Decode every one of `ids` not yet known, in one call."""


@runtime_checkable
class Engine(Protocol):
    """The engine tier: a model that tokenizes and steps. Not thread-safe: one thread owns it."""

    info: ModelInfo  # its description, capabilities included
    special_ids: set[int]
    eos_ids: set[int]

    @property
    def pieces(self) -> Pieces:
        """Its pieces (what a record's lazy prompt predictions keep: not the engine)."""

    device: Any  # where its scores live (a torch.device): masks and chunk sizes follow it
    tokenizer: Any  # the Hugging Face tokenizer the grammar engine (llguidance) and a comparison read
    cache: Any  # what it has been fed, to go back to (see use_cache)
    # Asked between the layers of a forward pass (set by the worker during autoplay): True sets the step
    # aside (GiveWay, the engine as it was) so a waiting key is answered at once.
    give_way: Callable[[], bool] | None

    def use_cache(self, cache: Any) -> None:
        """Go on from `cache` (a fresh one, or one kept from before)."""

    def chat_ids(self, user: str, system: str | None = None) -> Any:
        """The conversation through the model's chat template: `.ids` and `.template` (which ids it added)."""

    def twin(self) -> Self:
        """Another engine on the same model, with a cache of its own."""

    def joined(self, last: Any, routes: list[Any], places: list[Any]) -> Any:
        """The last of several passes over one prompt, with the earlier passes' routing and times joined."""

    def read_routing(self, host: dict[str, Any]) -> Any:
        """The routing in a step's transfer (a Routing), or None."""

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

    def reset(self) -> None:
        """Forget everything fed: the next forward starts a new context."""

    def crop(self, length: int) -> None:
        """Keep the first `length` tokens fed; the next forward goes on from there."""

    def forward(
        self,
        ids: list[int],
        every_position: bool = False,
        cancelled: Callable[[], bool] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Any:
        """Feed `ids` after what it holds: the next-token scores (`.logits`), and with
        `every_position` what it predicted after each of them (`.predictions(next_ids)`, the columns
        of decoding.prompt_predictions). An engine whose pass has layers asks `cancelled()` before
        each (True raises Cancelled, the caller undoing what the pass fed) and tells
        `progress(layer, layers)`. A failure it can name (a server's, a model's) is a TokenvizError
        of one line."""


@runtime_checkable
class DrawingEngine(Engine, Protocol):
    """An engine that draws the next token itself, with the settings sent to it (a model server). Its
    distribution is the top-N it returns (`forward` feeds tokens without a request); the stages shown
    beside its draw are recomputed over that top-N. Its scores are a Drawn: its interventions' own_logits
    give the model's own top-N so."""

    top_n: int  # log-probabilities asked for at each step
    raw: bool | None  # its log-probabilities are the model's own, before the settings (None: not measured yet)
    say: Callable[[str], None]  # a line for the user while a request waits (a busy server retried)

    def draw(self, ids: Sequence[int], settings: SamplingSettings) -> Drawn:
        """The engine's next token after `ids`, drawn with `settings`."""

    def logprob_of(self, ids: Sequence[int], token: int) -> tuple[float, int]:
        """(log-probability, 1-based rank) of `token` after `ids` (a forced token outside the top-N)."""


@runtime_checkable
class CachedEngine(Engine, Protocol):
    """The cached tier: a KV cache that can be read and fed again."""

    @property
    def kv_bytes(self) -> int:
        """The bytes its KV cache holds now."""

    def logits_after(self, ids: Sequence[int], start: int) -> Scores:
        """The next-token scores after each of `ids[start:]`, the cache left as it was."""

    def attention(self, ids: Sequence[int], rows: range, layers: Sequence[int]) -> Scores:
        """Exact attention weights of positions `rows` for `layers`: (layers, heads, rows, keys), the
        model's own softmax over the keys up to each row (0 past it)."""

    def beam_search(
        self,
        ids: list[int],
        width: int,
        steps: int,
        cancelled: Any = None,
        from_cache: bool = False,
        progress: Any = None,
    ) -> BeamResult:
        """Beam search from `ids` (a BeamResult); with `from_cache`, from a copy of the cache."""

    def speculate(
        self,
        ids: list[int],
        drafter: str,
        steps: int,
        settings: Any,
        draft: Any = None,
        cancelled: Any = None,
        from_cache: bool = False,
        progress: Any = None,
    ) -> Speculation:
        """Speculative decoding from `ids` (a Speculation), drafted as `drafter` names."""

    def recompute(self, ids: list[int], chunk: int | None = None, progress: Any = ..., cancelled: Any = ...) -> Any:
        """The whole of `ids` again without the cache: (next-token scores, last row of every layer)."""


class Intervening(Protocol):
    """The interventions in force on an engine's model, with the model's own passes beside them."""

    interventions: tuple[Intervention, ...]

    def own_logits(self, ids: Sequence[int]) -> tuple[Scores, Any]:
        """The model's own next-token scores after `ids`, and the pass's timer."""

    def suspended(self) -> AbstractContextManager[None]:
        """The model without these interventions, inside the block."""

    def remove(self) -> None:
        """Take every hook off the model: it runs as it would without them."""


@runtime_checkable
class InternalsEngine(CachedEngine, Protocol):
    """The internals tier: the model's layers can be read and changed."""

    def inspect(self, ids: list[int], positions: list[int], chosen: list[int], pinned: tuple[int, ...]) -> list[Any]:
        """Each position's Inspection (embedding, residual norms, logit lens), one forward pass for all."""

    def attribute(
        self, ids: list[int], target: int, method: str, progress: Any = None, cancelled: Any = None
    ) -> tuple[float, list[float]]:
        """log p(target | ids) and each token's attribution to it."""

    def logit_difference(self, ids: list[int], a: int, b: int, progress: Any = None, cancelled: Any = None) -> Any:
        """logit(a) − logit(b) after `ids`, split by layer (a LogitDifference)."""

    def intervene(
        self, interventions: Sequence[Intervention], context: Sequence[int], token_id: Callable[[str], int]
    ) -> Intervening:
        """The interventions resolved (a mean ablation over `context`) and hooked into the model."""
