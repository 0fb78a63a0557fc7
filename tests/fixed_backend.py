"""The tests' own backend that steps (contract.stepping): its next token is the character after the last."""

from __future__ import annotations

from collections.abc import Sequence

from tokenviz.contract.backend import BackendOption, Opening
from tokenviz.contract.engine import WHOLE_VOCABULARY
from tokenviz.contract.records import ModelInfo

VOCAB, PEAK = 96, 5.0  # token i is the character chr(32 + i); PEAK is the logit of the next character


class FixedModel:
    info = ModelInfo(
        name="fixed", device="here", dtype="float32", layers=1, heads=1, kv_heads=1, head_dim=1, hidden=1,
        vocab=VOCAB, context=256, architecture="fixed logits", tied_embeddings=False, positions="none",
        capabilities=("step",), distribution=WHOLE_VOCABULARY,
    )  # fmt: skip
    eos_ids = frozenset[int]()

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        return [(ord(c) - 32) % VOCAB for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(32 + i) for i in ids)

    def forward(self, ids: list[int]) -> list[float]:
        return [PEAK if i == (ids[-1] + 1) % VOCAB else 0.0 for i in range(VOCAB)]

    def crop(self, length: int) -> None:
        pass

    def twin(self) -> FixedModel:
        return FixedModel()


class FixedBackend:
    name, about = "fixed", "one distribution whatever the context (the tests' own)"
    weights_here, draws = True, False
    options: tuple[BackendOption, ...] = ()

    def asked(self, given: frozenset[str]) -> bool:
        return False

    def loader(self, opening: Opening):
        return lambda progress: FixedModel()


BACKEND = FixedBackend()
