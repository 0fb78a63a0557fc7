"""The tests' own backend whose runtime draws each token itself and says only the top 5 with each draw,
keeping nothing of a context (contract.stepping.DrawingModel, as a server's API is). Its distribution
depends on the whole context; it draws with the temperature and the seed sent (no other stage)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from fixed_backend import FixedBackend

from tokenviz.contract.backend import Opening
from tokenviz.contract.records import ModelInfo
from tokenviz.contract.results import Drawn
from tokenviz.contract.settings import SamplingSettings

VOCAB = 96  # token i is the character chr(32 + i)
TOP_N = 5


def logprobs_after(ids: Sequence[int]) -> torch.Tensor:
    """The model's own log-probabilities after `ids`: the whole context moves its peak."""
    peak = (sum((i + 1) * t for i, t in enumerate(ids)) * 7 + len(ids)) % VOCAB
    spread = torch.arange(VOCAB, dtype=torch.float64)
    return torch.log_softmax(-(spread - peak).abs() * 0.7 - spread * 1e-3, 0)


class DrawingFixed:
    top_n = TOP_N

    def __init__(self) -> None:
        self.info = ModelInfo(
            name="drawn", device="its runtime", dtype="float64", layers=1, heads=1, kv_heads=1, head_dim=1,
            hidden=1, vocab=VOCAB, context=256, architecture="a drawn distribution", tied_embeddings=False,
            positions="none", capabilities=("step",), covers=TOP_N, draws="its runtime, with the settings sent",
            distribution=f"its runtime's top {TOP_N} log-probabilities, before the settings",
            requests="the drawing runtime", numbers_of="its runtime", reproduced_within=1e-9,
        )  # fmt: skip
        self.eos_ids: set[int] = set()

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        return [(ord(c) - 32) % VOCAB for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(32 + i) for i in ids)

    def draw(self, ids: Sequence[int], settings: SamplingSettings) -> Drawn:
        own = logprobs_after(ids)
        if settings.temperature == 0:
            chosen = int(own.argmax())
        else:
            generator = torch.Generator().manual_seed((settings.seed or 0) * 7919 + len(ids))
            chosen = int(torch.multinomial(torch.softmax(own / settings.temperature, 0), 1, generator=generator))
        top = torch.topk(own, TOP_N)
        logprob, rank = self.logprob_of(ids, chosen)
        pairs = tuple(zip(top.indices.tolist(), top.values.tolist()))
        return Drawn(chosen=chosen, logprob=logprob, rank=rank, top=pairs, raw=True, ms=0.0)

    def logprob_of(self, ids: Sequence[int], token: int) -> tuple[float, int]:
        own = logprobs_after(ids)
        return float(own[token]), int((own > own[token]).sum()) + 1


class DrawingBackend(FixedBackend):
    name, about = "drawn", "a runtime that draws its own tokens and says its top 5 (the tests' own)"
    weights_here, draws = False, True

    def loader(self, opening: Opening):
        return lambda progress: DrawingFixed()


BACKEND = DrawingBackend()
