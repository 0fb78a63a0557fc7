"""What llama.cpp holds for an engine is given back once the engine is dropped: an engine has no close,
and a test run, a compare or the app's reloads open many. Each context of the bundled model at 4,096
tokens is about 150 MB; before, every engine kept its model, its journey's context and those of its lens,
attention rows and twin until the process ended (one test worker reached 13 GB)."""

from __future__ import annotations

import gc

import psutil
import pytest
from llama_reference import greedy_session

from tokenviz.contract.engine import LensAsk

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("llama_cpp")]

ROUNDS = 3
# Growth allowed over the rounds after the first: half of what one round kept before (about 500 MB). The
# allocator's arenas still grow over the first rounds (about 75 MB in all here, then flat).
GROWTH_MB = 250


def one_engine_and_its_views() -> None:
    """A journey of two steps, its lens, attention rows and a twin: each a context of its own."""
    session = greedy_session(2)
    engine, ids = session.engine, tuple(session.ids)
    engine.inspect(LensAsk(ids, (len(ids) - 1,), (session.generated_ids[-1],), (), None))
    engine.attention(ids, range(len(ids) - 1, len(ids)), [0])
    engine.twin().forward(list(ids))


def rss_mb() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


def test_an_engine_dropped_gives_back_its_model_and_contexts():
    one_engine_and_its_views()
    after_first = rss_mb()
    for _ in range(ROUNDS):
        one_engine_and_its_views()
    grown = rss_mb() - after_first
    assert grown < GROWTH_MB, f"{ROUNDS} engines opened and dropped kept {grown:.0f} MB"
