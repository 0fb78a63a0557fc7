"""Beams, speculation and verify start from the journey's own KV cache (or, for verify, run the
context again in chunks): the same results as from scratch, and the journey's cache as it was."""

import pytest
import torch

from tokenviz.backends.transformers.beams import beam_search
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.backends.transformers.speculation import make_drafter, speculative_decode
from tokenviz.contract.errors import Cancelled
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session

PROMPT = "The Eiffel Tower is located in the city of"


def journey(loaded, steps=5):
    session = Session(ModelRunner(loaded), SamplingSettings(temperature=0))
    session.start(PROMPT)
    for _ in range(steps):
        session.step()
    return session


def cache_state(runner):
    return [(layer.keys.clone(), layer.values.clone()) for layer in runner.cache.layers]


def assert_cache_unchanged(runner, before):
    after = cache_state(runner)
    assert len(after) == len(before)
    for (k0, v0), (k1, v1) in zip(before, after):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


@pytest.mark.parametrize("width", [2, 4])
def test_beams_from_the_journeys_cache_equal_beams_from_scratch(tiny, width):
    session = journey(tiny)
    before = cache_state(session.engine)
    steps = []
    cached = beam_search(
        session.engine, session.ids, width, 6, from_cache=True, progress=lambda d, t: steps.append((d, t))
    )
    assert_cache_unchanged(session.engine, before)
    fresh = beam_search(session.engine, session.ids, width, 6)
    assert [h.ids for h in cached.final] == [h.ids for h in fresh.final]
    assert [h.score for h in cached.final] == pytest.approx([h.score for h in fresh.final], abs=1e-4)
    assert steps[0] == (0, 6) and all(total == 6 for _, total in steps)


@pytest.mark.parametrize("drafter", ["early-exit:1", "prompt-lookup"])
def test_speculation_from_the_journeys_cache_equals_speculation_from_scratch(tiny, drafter):
    session = journey(tiny)
    before = cache_state(session.engine)
    settings = SamplingSettings(temperature=0.8, seed=3)
    cached = speculative_decode(
        session.engine, session.ids, make_drafter(drafter, session.engine), 12, settings, from_cache=True
    )
    assert_cache_unchanged(session.engine, before)
    fresh = speculative_decode(session.engine, session.ids, make_drafter(drafter, session.engine), 12, settings)
    assert cached.ids == fresh.ids
    assert [(r.drafted, r.accepted) for r in cached.rounds] == [(r.drafted, r.accepted) for r in fresh.rounds]


def test_a_recompute_in_chunks_equals_one_pass_and_can_be_cancelled(tiny):
    session = journey(tiny, steps=8)
    ids = session.cached_ids
    whole_logits, whole_rows = session.engine.recompute(ids)
    seen = []
    logits, rows = session.engine.recompute(ids, chunk=4, progress=lambda d, t: seen.append((d, t)))
    torch.testing.assert_close(logits, whole_logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(rows, whole_rows, atol=1e-5, rtol=0)
    assert seen == [(d, len(ids)) for d in range(4, (len(ids) - 1) // 4 * 4 + 1, 4)]
    with pytest.raises(Cancelled):
        session.engine.recompute(ids, chunk=4, cancelled=lambda: True)


# Beams staying, copied, swapped, rotated, all from one: a reorder in place must read each source
# before it is overwritten.
ORDERS = ([0, 0, 2], [1, 0, 2], [2, 0, 1], [1, 2, 0], [2, 2, 2], [0, 1, 2], [1, 1, 0])


def test_a_growing_layer_holds_what_a_dynamic_layer_holds_through_appends_reorders_and_crops():
    from transformers.cache_utils import DynamicLayer

    from tokenviz.backends.transformers.cache import GrowingLayer

    torch.manual_seed(0)
    grown, plain = GrowingLayer(), DynamicLayer()
    first = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    for layer in (grown, plain):
        layer.update(*first)
        layer.reorder_cache(torch.tensor([0, 0, 0]))  # one beam becomes three
    for step in range(GrowingLayer.ROOM + 3):  # past the room reserved: the buffer grows
        k, v = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
        order = torch.tensor(ORDERS[step % len(ORDERS)])
        for layer in (grown, plain):
            layer.update(k, v)
            layer.reorder_cache(order)
        if step % 7 == 6:
            for layer in (grown, plain):
                layer.crop(-2)
        assert grown.get_seq_length() == plain.get_seq_length()
        assert torch.equal(grown.keys, plain.keys) and torch.equal(grown.values, plain.values)
    for layer in (grown, plain):  # three beams become two
        layer.reorder_cache(torch.tensor([2, 1]))
        layer.update(torch.ones(2, 2, 1, 4), torch.ones(2, 2, 1, 4))
    assert torch.equal(grown.keys, plain.keys) and torch.equal(grown.values, plain.values)
