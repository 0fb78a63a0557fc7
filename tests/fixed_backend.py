"""A backend of the tests' own (registered in the tests alone): one distribution whatever the context,
peaked at the character after the last; token i is the character chr(32 + i)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from tokenviz.contract.backend import BackendOption, Opening
from tokenviz.contract.engine import WHOLE_VOCABULARY, Capability, in_order
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.records import ModelInfo
from tokenviz.decoding.prompt_predictions import predict_positions

VOCAB = 96  # token i is the character chr(32 + i)
PEAK = 5.0  # the logit of the character after the last


class FixedForward:
    def __init__(self, rows: torch.Tensor):
        self.rows, self.logits, self.routes, self.places = rows, rows[-1], None, None
        self.timer = self

    def wait(self) -> FixedForward:
        return self

    def ms(self) -> float:
        return 0.0

    def predictions(self, next_ids):
        return predict_positions(self.rows, next_ids)


class FixedEngine:
    """The smallest engine: one distribution whatever the context, peaked at the character after the last."""

    def __init__(self) -> None:
        self.info = ModelInfo(
            name="fixed", device="here", dtype="float32", layers=1, heads=1, kv_heads=1, head_dim=1, hidden=1,
            vocab=VOCAB, context=256, architecture="fixed logits", tied_embeddings=False, positions="none",
            capabilities=in_order({Capability.STEP}), distribution=WHOLE_VOCABULARY,
        )  # fmt: skip
        self.special_ids: set[int] = set()
        self.eos_ids: set[int] = set()
        self.device, self.tokenizer, self.cache = torch.device("cpu"), None, ()
        self.pieces = self

    def piece(self, token_id: int) -> str:
        return chr(32 + token_id)

    def learn(self, ids: Iterable[int]) -> None:
        pass

    learn_pieces = learn

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        return [(ord(c) - 32) % VOCAB for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.piece(i) for i in ids)

    def chat_ids(self, user, system=None):
        raise TokenvizError("no chat template")

    @property
    def kv_len(self) -> int:
        return len(self.cache)

    kv_bytes = 0

    def use_cache(self, cache) -> None:
        self.cache = tuple(cache)

    def reset(self) -> None:
        self.cache = ()

    def crop(self, length: int) -> None:
        self.cache = self.cache[:length]

    def twin(self) -> FixedEngine:
        return FixedEngine()

    def joined(self, last, routes, places):
        return last

    def read_routing(self, host):
        return None

    def forward(self, ids, every_position=False, cancelled=None, progress=None) -> FixedForward:
        self.cache = (*self.cache, *ids)
        rows = torch.zeros(len(ids), VOCAB)
        rows[range(len(ids)), [(i + 1) % VOCAB for i in ids]] = PEAK
        return FixedForward(rows)


class FixedBackend:
    name, about = "fixed", "one distribution whatever the context (the tests' own)"
    weights_here, draws = True, False
    options: tuple[BackendOption, ...] = ()

    def asked(self, given: frozenset[str]) -> bool:
        return False

    def loader(self, opening: Opening):
        return lambda progress: FixedEngine()
