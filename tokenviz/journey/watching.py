"""Watched tokens: which token a person means when they ask to watch one (an id, "id:7042", or a text
that the tokenizer makes into exactly one token, " Paris" with its leading space), and their values
filled in at the steps taken before they were watched."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tokenviz.contract.engine import Caching, Capability, DrawingEngine, Engine, require
from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.contract.records import PinnedToken, StepRecord
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.text import is_count
from tokenviz.decoding.drawn import drawn_decision, drawn_of
from tokenviz.decoding.sampling import follow_pinned
from tokenviz.journey import memory_policy
from tokenviz.journey.grammar_state import GrammarState

ID_PREFIX = "id:"


def token_of(runner: Engine, spec: int | str, purpose: str = "watch") -> int:
    """The token id `spec` names; one clear line when it names none, or several. `purpose` is what the
    token is for, as the line says it ("watch", "steer by")."""
    vocab = runner.info.vocab
    if isinstance(spec, str) and spec.startswith(ID_PREFIX):
        digits = spec[len(ID_PREFIX) :].strip()
        if not is_count(digits):
            raise TokenvizError(f"{spec!r} is not a token id: write id: and a number, like id:42")
        spec = int(digits)
    if isinstance(spec, int):
        if not 0 <= spec < vocab:
            raise TokenvizError(f"token id {spec} is outside the vocabulary (0-{vocab - 1})")
        return spec
    if not spec:
        raise TokenvizError(f"type a token to {purpose}: its text (with its leading space) or id:N")
    ids = [t for t in runner.encode(spec) if t not in runner.special_ids or runner.piece(t) == spec]
    if len(ids) != 1:
        pieces = " ".join(repr(runner.piece(t)) for t in ids[:6])
        raise TokenvizError(
            f"{spec!r} is {len(ids)} tokens ({pieces}), not one: {purpose} a single token, or give its id as id:N"
        )
    return ids[0]


class Watching(Protocol):
    """What filling in the watched tokens reads of the journey (a Session)."""

    engine: Engine
    records: list[StepRecord]
    ids: list[int]
    prompt_ids: list[int]
    pinned: tuple[int, ...]

    @property
    def grammars(self) -> GrammarState: ...


def with_watched(
    journey: Watching,
    progress: Callable[[int, int], None] = lambda done, total: None,
    cancelled: Callable[[], bool] = lambda: False,
) -> list[StepRecord]:
    """The journey's records with the watched tokens' values at every step that lacks them (watched later,
    or a branch switched to): the steps' logits again, fed over the cache a chunk at a time
    (`progress(done, total)` after each chunk, `cancelled()` asked between them: Cancelled leaves nothing
    filled)."""
    filled = _watched(
        journey.engine,
        journey.records,
        journey.ids,
        len(journey.prompt_ids),
        journey.pinned,
        journey.grammars.allowed,
        progress,
        cancelled,
    )
    records = list(journey.records)
    for i, pinned in filled.items():
        records[i] = dataclasses.replace(records[i], decision=dataclasses.replace(records[i].decision, pinned=pinned))
    return records


def _watched(
    engine: Engine,
    records: Sequence[StepRecord],
    ids: Sequence[int],
    prompt_len: int,
    pinned: tuple[int, ...],
    allowed: Callable[[SamplingSettings, Sequence[int]], Any],
    progress: Callable[[int, int], None],
    cancelled: Callable[[], bool],
) -> dict[int, tuple[PinnedToken, ...]]:
    """The watched tokens' values at every step of `records` that lacks them, by index."""
    stale = [i for i, r in enumerate(records) if r.decision.pinned_ids != pinned]
    if not stale:
        return {}
    if isinstance(engine, DrawingEngine):  # a server's steps: from the top-N each record kept
        return {i: _from_record(engine, records[i], ids, prompt_len, pinned) for i in stale}
    cache: Caching = require(engine, Capability.CACHE, "watching a token at the steps before")
    filled = {}
    chunk_size = memory_policy.PREFILL_CHUNK
    for begin in range(0, len(stale), chunk_size):
        chunk = stale[begin : begin + chunk_size]
        start = records[chunk[0]].position - 1
        logits = cache.logits_after(ids[: records[chunk[-1]].position], start)
        for i in chunk:
            record = records[i]
            filled[i] = follow_pinned(
                logits[record.position - 1 - start],
                record.decision,
                ids[: record.position],
                ids[prompt_len : record.position],
                pinned,
                engine.piece,
                allowed(record.decision.settings, ids[prompt_len : record.position]),
            )
        done = begin + len(chunk)
        progress(done, len(stale))
        if done < len(stale) and cancelled():
            raise Cancelled("watching cancelled: the watched tokens are as they were")
    return filled


def _from_record(
    engine: DrawingEngine, record: StepRecord, ids: Sequence[int], prompt_len: int, pinned: tuple[int, ...]
) -> tuple[PinnedToken, ...]:
    """The watched tokens at a step a server drew, from the top-N its record kept (no request): a token
    outside it has no probability the server returned."""
    d = record.decision
    forced = (d.chosen_id, math.log(d.raw_prob) if d.raw_prob > 0 else -math.inf, d.raw_rank)
    again = drawn_decision(
        drawn_of(record.top, d, engine.raw is not False),
        d.settings,
        ids[: record.position],
        ids[prompt_len : record.position],
        engine.piece,
        engine.info.vocab,
        forced if d.mode == "forced" else None,
        pinned,
    )
    return again.pinned
