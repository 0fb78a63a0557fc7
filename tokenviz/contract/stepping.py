"""The least a backend gives: a model that tokenizes and steps, with no torch or transformers type in it.

A backend's loader makes a `Stepping` or a whole `Engine` (contract.engine). The journey speaks to an
Engine; a Stepping is made one by tokenviz.journey.stepped_engine, which adds what a Stepping leaves
out (the tokens fed as its cache, one pass per position where every position's predictions are asked,
each token's piece decoded alone) and finds what it offers beyond the least by asking: the members of
the small protocols below, and each capability's protocol in contract.engine (a lens, attention rows)
where its ModelInfo declares the capability. docs/ARCHITECTURE.md shows one, whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

from tokenviz.contract.records import ModelInfo

if TYPE_CHECKING:  # (a type only: the contract imports no numpy at run time)
    import numpy as np

    from tokenviz.contract.engine import ChatIds

Logits: TypeAlias = "Sequence[float] | np.ndarray"  # one score per token of the vocabulary


@runtime_checkable
class Stepping(Protocol):
    """A model that tokenizes and steps: what every backend gives. Not thread-safe: one thread owns it."""

    info: ModelInfo  # its description: `capabilities` names at least Capability.STEP
    eos_ids: set[int]  # the tokens that end a generation

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        """`text`'s token ids (with the model's special tokens, a BOS, where `special_tokens`)."""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, as the model's tokenizer decodes them together."""

    def forward(self, ids: list[int]) -> Logits:
        """Feed `ids` after the tokens it holds: the next-token logits after the last, over the whole
        vocabulary. A failure it can name is a TokenvizError of one line."""

    def crop(self, length: int) -> None:
        """Keep the first `length` tokens fed; the next forward goes on from there."""


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
    two journeys, a drafted speculation)."""

    def twin(self) -> Stepping:
        """Another Stepping on the same model, fed nothing."""
