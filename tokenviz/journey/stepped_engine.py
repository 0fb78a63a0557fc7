"""The least a backend gives (contract.stepping: a Stepping, or a DrawingModel) made a whole Engine.

What it leaves out is made here from what it gives: the tokens fed are a Stepping's cache (going back to
one is cropping to the shared start and feeding the rest again) and a DrawingModel's context (each draw
carries it whole); every position's predictions are one call per position; a token's piece is it
decoded alone. What it offers beyond the least is found by asking: the small protocols of
contract.stepping, and each capability's own protocol, whose members reach the Stepping itself
(`CAPABILITY_MEMBERS`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from tokenviz.contract.engine import (
    ChatIds,
    DenseInOnePlace,
    DrawingEngine,
    Elapsed,
    Engine,
    IsCancelled,
    OnProgress,
    shared_prefix,
)
from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.contract.results import Drawn
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.stepping import (
    Chats,
    DrawingModel,
    Logits,
    MarksSpecialTokens,
    NamesPieces,
    Stepping,
    Tokenizes,
    Twins,
)
from tokenviz.contract.text import safe_text
from tokenviz.decoding.drawn import NEUTRAL, prompt_columns
from tokenviz.decoding.prompt_predictions import TOP, predict_positions

# The members of contract.engine's capability protocols (Caching, AttentionRows, Lens, Attributing,
# LogitSplitting, Intervenable, OwnGrammarVocabulary): a Stepping that has them gives them as they are.
CAPABILITY_MEMBERS = frozenset(
    {"logits_after", "beam_search", "speculate", "recompute", "attention", "inspect", "attribute",
     "logit_difference", "intervene", "grammar_vocabulary"}
)  # fmt: skip


def as_engine(opened: Engine | Stepping | DrawingModel) -> Engine:
    """What a backend's loader made, as the journey speaks to it."""
    if isinstance(opened, Engine):
        return opened
    if isinstance(opened, DrawingModel):
        return DrawnEngine(opened)
    if not isinstance(opened, Stepping):
        raise TokenvizError(f"the backend made a {type(opened).__name__}: no engine, Stepping or DrawingModel")
    return engine_of(opened)


def engine_of(stepping: Stepping) -> SteppedEngine:
    """`stepping` as an Engine, with the capabilities' members it has."""
    has_more = any(hasattr(stepping, name) for name in CAPABILITY_MEMBERS)
    return SteppedEngineWithMore(stepping) if has_more else SteppedEngine(stepping)


class SteppedForward:
    """One pass's logits: after the last token fed, and after each where every position was asked."""

    def __init__(self, rows: torch.Tensor, milliseconds: float):
        self.rows, self.logits = rows, rows[-1]
        self.timer, self.routes, self.places = Elapsed(milliseconds), None, None

    def predictions(self, next_ids: Sequence[int]) -> dict[str, torch.Tensor]:
        return predict_positions(self.rows, next_ids)


class DrawnForward:
    """Tokens fed to a DrawingModel: nothing is asked of it until a draw, or a prediction, is."""

    def __init__(self, engine: DrawnEngine, context: tuple[int, ...], start: int):
        self.engine, self.context, self.start = engine, context, start
        self.logits, self.timer, self.routes, self.places = None, Elapsed(), None, None

    def predictions(self, next_ids: Sequence[int]) -> dict[str, torch.Tensor]:
        """The model's top N after each position fed from `start`, and `next_ids`' own (a draw per
        position with no sampling stage, so its log-probabilities are the model's own)."""
        started = time.perf_counter()
        context = [*self.context[: self.start + 1], *next_ids]
        entries = [self.engine.said_after(context[: self.start + 1 + i], t) for i, t in enumerate(next_ids)]
        self.timer.milliseconds += (time.perf_counter() - started) * 1e3
        return prompt_columns(entries, next_ids, TOP)


class SteppedPieces:
    """Each token's text, asked of the model once per id and kept, safe to print."""

    def __init__(self, model: Tokenizes):
        self.model, self.known = model, dict[int, str]()

    def piece(self, token_id: int) -> str:
        known = self.known.get(token_id)
        if known is None:
            text = self.model.piece(token_id) if isinstance(self.model, NamesPieces) else self.model.decode([token_id])
            known = self.known[token_id] = safe_text(text)
        return known

    def learn(self, ids: Iterable[int]) -> None:
        for token_id in ids:
            self.piece(token_id)


class FedTokens(DenseInOnePlace):
    """What a Stepping and a DrawingModel are given alike: the tokens fed, on the CPU's tensors."""

    device = torch.device("cpu")  # the logits it gives are made a tensor here
    tokenizer = None  # no Hugging Face tokenizer: no Capability.TOKENIZER or GRAMMAR
    kv_bytes = 0  # what it keeps is its own

    def __init__(self, model: Tokenizes):
        self.model, self.info, self.eos_ids = model, model.info, set(model.eos_ids)
        self.special_ids = set(model.special_ids if isinstance(model, MarksSpecialTokens) else self.eos_ids)
        self.pieces = SteppedPieces(model)
        self.fed: list[int] = []

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        return self.model.encode(text, special_tokens)

    def decode(self, ids: Iterable[int]) -> str:
        return self.model.decode(list(ids))

    def piece(self, token_id: int) -> str:
        return self.pieces.piece(token_id)

    def learn_pieces(self, ids: Iterable[int]) -> None:
        self.pieces.learn(ids)

    def chat_ids(self, user: str, system: str | None = None) -> ChatIds:
        if not isinstance(self.model, Chats):
            raise TokenvizError(f"{self.info.name} has no chat template here (its backend gives none)")
        return self.model.chat_ids(user, system)

    @property
    def cache(self) -> tuple[int, ...]:
        return tuple(self.fed)

    def use_cache(self, cache: object) -> None:
        ids = [int(i) for i in cache] if isinstance(cache, tuple) else []
        keep = shared_prefix(self.fed, ids)
        self.crop(keep)
        if keep < len(ids):
            self.forward(ids[keep:])

    @property
    def kv_len(self) -> int:
        return len(self.fed)

    def reset(self) -> None:
        self.crop(0)

    def crop(self, length: int) -> None:
        del self.fed[length:]

    def forward(
        self, ids: list[int], every_position: bool = False, cancelled: IsCancelled = None, progress: OnProgress = None
    ) -> SteppedForward | DrawnForward:
        raise NotImplementedError


class SteppedEngine(FedTokens):
    """A Stepping as an Engine: the tokens it was fed are its cache."""

    def __init__(self, stepping: Stepping):
        super().__init__(stepping)
        self.stepping = stepping

    def twin(self) -> SteppedEngine:
        if not isinstance(self.stepping, Twins):
            raise TokenvizError(f"{self.info.name} runs one journey at a time (its backend opens no second)")
        return engine_of(self.stepping.twin())

    def crop(self, length: int) -> None:
        self.stepping.crop(length)
        super().crop(length)

    def forward(
        self, ids: list[int], every_position: bool = False, cancelled: IsCancelled = None, progress: OnProgress = None
    ) -> SteppedForward:
        """Feed `ids` in one call to the Stepping, or one call per token where every position's
        predictions are asked; `cancelled` is asked before each call (Cancelled leaves what was fed, for
        the caller to undo) and `progress` told after it."""
        started = time.perf_counter()
        calls = [[token] for token in ids] if every_position else [ids]
        rows = []
        for done, call in enumerate(calls, 1):
            if cancelled is not None and cancelled():
                raise Cancelled("the pass cancelled")
            rows.append(self._scores(self.stepping.forward(call)))
            self.fed.extend(call)
            if progress is not None:
                progress(done, len(calls))
        return SteppedForward(torch.stack(rows), (time.perf_counter() - started) * 1e3)

    def _scores(self, logits: Logits) -> torch.Tensor:
        """The logits a Stepping gave, as a tensor: one line where they are not one per token."""
        try:
            scores = torch.as_tensor(logits, dtype=torch.float32).reshape(-1)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TokenvizError(f"{self.info.name}'s backend gave logits that are not numbers: {exc}") from None
        if scores.numel() != self.info.vocab:
            raise TokenvizError(
                f"{self.info.name}'s backend gave {scores.numel():,} logits for a vocabulary of {self.info.vocab:,}"
            )
        return scores


class DrawnEngine(FedTokens):
    """A DrawingModel as a DrawingEngine: the tokens fed are the context each draw carries."""

    def __init__(self, drawing: DrawingModel):
        super().__init__(drawing)
        self.drawing, self.top_n = drawing, drawing.top_n
        self.raw: bool | None = None  # what its last draw said

    def twin(self) -> DrawnEngine:
        return DrawnEngine(self.drawing)  # the model keeps nothing of a context: the new one is fed nothing

    def forward(
        self, ids: list[int], every_position: bool = False, cancelled: IsCancelled = None, progress: OnProgress = None
    ) -> DrawnForward:
        """Keep `ids` as the context's next tokens (asked of the model with the next draw)."""
        if cancelled is not None and cancelled():
            raise Cancelled("the pass cancelled")
        start = len(self.fed)
        self.fed.extend(ids)
        return DrawnForward(self, tuple(self.fed), start)

    def draw(self, ids: Sequence[int], settings: SamplingSettings) -> Drawn:
        drawn = self.drawing.draw(ids, settings)
        outside = [t for t in (drawn.chosen, *(token for token, _ in drawn.top)) if not 0 <= t < self.info.vocab]
        if outside:
            raise TokenvizError(f"{self.info.name}'s backend gave token {outside[0]}, outside its vocabulary")
        self.raw = drawn.raw
        return drawn

    def logprob_of(self, ids: Sequence[int], token: int) -> tuple[float, int]:
        return self.drawing.logprob_of(ids, token)

    def said_after(self, ids: Sequence[int], following: int) -> dict[int, tuple[float, int]]:
        """{id: (log-probability, rank)} of the top N after `ids`, and of `following`."""
        top = self.drawing.draw(ids, NEUTRAL).top
        said = {token: (logprob, rank) for rank, (token, logprob) in enumerate(top, 1)}
        if following not in said:
            said[following] = self.drawing.logprob_of(ids, following)
        return said


class SteppedEngineWithMore(SteppedEngine):
    """A SteppedEngine whose Stepping gives capabilities' members too: asked of it, they are its own."""

    def __getattr__(self, name: str) -> Any:
        if name in CAPABILITY_MEMBERS:
            return getattr(self.__dict__["stepping"], name)
        raise AttributeError(name)


def conforms(stepped: SteppedEngine, drawn: DrawnEngine) -> tuple[Engine, DrawingEngine]:
    """A SteppedEngine is a whole Engine and a DrawnEngine a DrawingEngine, checked by mypy here."""
    return stepped, drawn
