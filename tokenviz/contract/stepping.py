"""The least a backend gives: a model that tokenizes and steps, with no torch or transformers type in it.

A backend's loader makes a `Stepping` (logits after the tokens fed), a `DrawingModel` (a runtime that
draws each token itself and says the top N of its distribution, keeping nothing here: a server's API) or
a whole `Engine` (contract.engine). The journey speaks to an
Engine; a Stepping or a DrawingModel is made one by tokenviz.journey.stepped_engine, which adds what it
leaves out (the tokens fed as its cache, one pass per position where every position's predictions are asked,
each token's piece decoded alone) and finds what it offers beyond the least by asking: the members of
the small protocols below, and each capability's protocol in contract.engine (a lens, attention rows)
where its ModelInfo declares the capability. docs/ARCHITECTURE.md shows one, whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

from tokenviz.contract.records import ModelInfo
from tokenviz.contract.results import Drawn
from tokenviz.contract.settings import SamplingSettings

if TYPE_CHECKING:  # a type only: the contract imports no numpy at run time
    import numpy as np

    from tokenviz.contract.engine import ChatIds

Logits: TypeAlias = "Sequence[float] | np.ndarray"  # one score per token of the vocabulary


@runtime_checkable
class Tokenizes(Protocol):
    """What every model a backend makes has: its description and its tokenizer. Not thread-safe: one
    thread owns it."""

    info: ModelInfo  # its description: `capabilities` names at least Capability.STEP
    eos_ids: AbstractSet[int]  # the tokens that end a generation

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        """`text`'s token ids (with the model's special tokens, a BOS, where `special_tokens`)."""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, as the model's tokenizer decodes them together."""


@runtime_checkable
class Stepping(Tokenizes, Protocol):
    """A model that steps: the next-token logits after the tokens it was fed."""

    def forward(self, ids: list[int]) -> Logits:
        """Feed `ids` after the tokens it holds: the next-token logits after the last, over the whole
        vocabulary. A failure it can name is a TokenvizError of one line."""

    def crop(self, length: int) -> None:
        """Keep the first `length` tokens fed; the next forward goes on from there."""


@runtime_checkable
class DrawingModel(Tokenizes, Protocol):
    """A model whose runtime draws each next token itself, with the settings sent, and says the top N
    of its distribution with the draw; it keeps nothing of a context here (each ask carries it whole)."""

    top_n: int  # how many log-probabilities each draw returns

    def draw(self, ids: Sequence[int], settings: SamplingSettings) -> Drawn:
        """Its next token after `ids`, drawn with `settings`, and the top N it says with it (`Drawn.raw`:
        whether those log-probabilities are the model's own, before the settings)."""

    def logprob_of(self, ids: Sequence[int], token: int) -> tuple[float, int]:
        """(log-probability, 1-based rank) of `token` after `ids` (a forced token outside the top N)."""


@runtime_checkable
class NamesPieces(Protocol):
    """A Stepping whose tokens' text is not each one decoded alone (a byte-level piece, say)."""

    def piece(self, token_id: int) -> str:
        """The text one token adds."""


@runtime_checkable
class MarksSpecialTokens(Protocol):
    """A Stepping with special tokens beyond its end-of-sequence ones (the views mark them)."""

    special_ids: set[int]


@runtime_checkable
class Chats(Protocol):
    """A Stepping with a chat template."""

    def chat_ids(self, user: str, system: str | None = None) -> ChatIds:
        """The conversation through the model's chat template, and which ids it added."""


@runtime_checkable
class Twins(Protocol):
    """A Stepping that opens another on the same model, with what it was fed its own (a comparison's
    two journeys, a drafted speculation). A DrawingModel keeps nothing of a context: it needs none."""

    def twin(self) -> Stepping:
        """Another Stepping on the same model, fed nothing."""
