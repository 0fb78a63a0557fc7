"""The journey's tokens as chips (their pieces, and which are the prompt's, the tokenizer's specials and
the chat template's), kept between frames: a journey that grew by a token makes one chip, not all again."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Protocol

from tokenviz.contract.engine import Engine
from tokenviz.contract.records import TokenChip


def token_chips(
    engine: Engine, ids: Sequence[int], prompt_len: int, template: Sequence[bool], start: int = 0
) -> list[TokenChip]:
    """`ids[start:]` as chips: their pieces, which are the prompt's, the tokenizer's specials and the
    chat template's."""
    special = engine.special_ids
    return [
        TokenChip(
            id=t,
            text=engine.piece(t),
            is_prompt=i < prompt_len,
            is_special=t in special,
            is_template=i < len(template) and template[i],
        )
        for i, t in enumerate(ids[start:], start=start)
    ]


class ChipCache:
    """The chips of the last journey asked for, remade only from where the tokens changed."""

    def __init__(self) -> None:
        self._chips: list[TokenChip] = []
        self._ids: list[int] = []
        self._key: tuple[list[int], list[bool]] | None = None
        self._tuple: tuple[TokenChip, ...] = ()

    def of(self, engine: Engine, ids: list[int], prompt_ids: list[int], template: list[bool]) -> tuple[TokenChip, ...]:
        kept = self._chips if self._key == (prompt_ids, template) else []
        same = len(kept) if ids[: len(kept)] == self._ids[: len(kept)] else 0
        if same == len(kept) == len(ids):
            return self._tuple
        self._chips = kept[:same] + token_chips(engine, ids, len(prompt_ids), template, same)
        self._ids = list(ids)
        self._key = (list(prompt_ids), list(template))
        self._tuple = tuple(self._chips)
        return self._tuple


class Tokens(Protocol):
    """What the chips are made of (a Session)."""

    engine: Engine
    ids: list[int]
    prompt_ids: list[int]
    template: list[bool]


_KEPT: weakref.WeakKeyDictionary[Tokens, ChipCache] = weakref.WeakKeyDictionary()  # by journey


def chips_of(journey: Tokens) -> tuple[TokenChip, ...]:
    """The journey's tokens as chips, kept between calls: a journey that grew by a token makes one chip,
    not all of them again (the engine thread asks at every snapshot)."""
    kept = _KEPT.setdefault(journey, ChipCache())
    return kept.of(journey.engine, journey.ids, journey.prompt_ids, journey.template)
