"""Every common architecture, exact: a tiny random-weight model of each family (sliding windows of
6 positions, shorter than the sequences here; hybrid sliding/global layers; ALiBi; logit scaling and
soft-capping; mixture of experts) held to transformers itself."""

from functools import cache

import pytest
import torch
from beamtools import generate_beams
from families import FAMILIES, family_model
from stock import saved, stock, stock_forward

from tokenviz.backends.transformers.beams import beam_search
from tokenviz.backends.transformers.lens import inspect_positions
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.backends.transformers.speculation import make_drafter, speculative_decode
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session
from tokenviz.journey.verification import verify_latest

PROMPT = "The cat sat on the mat. The cat sat on the"
STEPS = 12
GREEDY = SamplingSettings(temperature=0, max_new_tokens=1000)

pytestmark = [pytest.mark.families, pytest.mark.parametrize("kind", list(FAMILIES))]


NO_SDPA = {"gemma2", "gpt_neo", "bloom", "xglm", "mpt"}  # transformers gives these eager attention only


def stock_of(kind: str) -> str:
    """The family model's weights, saved for transformers to load on its own (see tests/stock.py)."""
    return saved(family_model(kind).model)


@cache
def reference(kind: str) -> tuple[list[int], list[int]]:
    """(prompt ids, generate()'s greedy tokens), from transformers' own model in its sdpa attention
    (eager where it has no other), loaded afresh: none of tokenviz's attention, capture or mask."""
    loaded = family_model(kind)
    ids = loaded.tokenizer(PROMPT)["input_ids"]
    model = stock(stock_of(kind), "eager" if kind in NO_SDPA else "sdpa")
    model.generation_config.pad_token_id = loaded.model.generation_config.pad_token_id
    model.generation_config.eos_token_id = None  # (as the family models: the whole length)
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=STEPS, min_new_tokens=STEPS)
    return ids, out[0, len(ids) :].tolist()


def runner_of(kind: str, seed: int = 0) -> ModelRunner:
    runner = ModelRunner(family_model(kind, seed))
    runner.eos_ids = set()  # as generate() here: the family models have no end-of-sequence token
    return runner


def greedy_session(kind: str, steps: int = STEPS) -> Session:
    ids, _ = reference(kind)
    session = Session(runner_of(kind), GREEDY)
    session.start(ids)
    for _ in range(steps):
        session.step()
    return session


def test_greedy_steps_equal_generate_and_a_full_recompute(kind):
    _, generated = reference(kind)
    s = greedy_session(kind)
    assert s.generated_ids == generated
    full = stock_forward(stock_of(kind), s.ids)  # transformers' eager attention, its weights returned
    for record in s.records:
        query = record.position - 1  # the last position this forward pass read
        logits = full.logits[0, query]
        assert [c.logit for c in record.top] == pytest.approx(logits[[c.id for c in record.top]].tolist(), abs=1e-4)
    # Every row the attention pane can show, prompt rows and decode rows, on every layer (sliding
    # and global): computed on demand, equal to eager attention over the whole sequence.
    n = s.engine.kv_len
    shown = s.attention(range(n), range(s.engine.info.layers))
    for layer, attention in enumerate(full.attentions):
        assert abs(shown[layer] - attention[0, :, :n, :n].numpy()).max() < 1e-5
    v = verify_latest(s.engine, s.cached_ids)
    assert v.max_logit_diff < 1e-4 and v.max_attention_diff < 1e-5 and v.argmax_agrees
    keys = s.engine.cache.layers[0].keys  # the KV cache pane's figures are the cache's own
    assert (s.engine.info.kv_heads, s.engine.info.head_dim) == (keys.shape[1], keys.shape[-1])


def test_rewind_and_branch_equal_plain_greedy(kind):
    ids, generated = reference(kind)
    s = greedy_session(kind)
    s.rewind(5)
    for _ in range(5):
        s.step()
    assert s.generated_ids == generated
    s.rewind(STEPS - 3)  # back to 3 generated tokens, then the 2nd ranked token there
    forced = s.pending.top[1].id
    s.take_rank(2)
    for _ in range(3):
        s.step()
    straight = Session(runner_of(kind), GREEDY)
    straight.start(ids + generated[:3] + [forced])
    for _ in range(3):
        straight.step()
    assert s.ids == straight.ids
    assert s.pending.decision.chosen_id == straight.pending.decision.chosen_id


@pytest.mark.parametrize("drafter", ["prompt-lookup", "early-exit:2", "draft-model"])
def test_greedy_speculation_equals_plain_greedy(kind, drafter):
    ids, generated = reference(kind)
    runner = runner_of(kind)
    draft = runner_of(kind, seed=1) if drafter == "draft-model" else None
    result = speculative_decode(runner, ids, make_drafter(drafter, runner, draft), STEPS, GREEDY)
    assert list(result.ids) == generated
    assert result.drafted > 0


def test_the_lens_last_layer_is_the_models_output(kind):
    s = greedy_session(kind, steps=2)
    position = len(s.ids) - 1
    inspection = inspect_positions(s.engine, s.ids, [position], [s.pending.decision.chosen_id])[0]
    output = s.pending.top[:3]
    assert [t[0] for t in inspection.lens[-1].top] == [c.id for c in output]
    assert [t[2] for t in inspection.lens[-1].top] == pytest.approx([c.prob for c in output], abs=1e-5)


def test_beam_search_equals_generate(kind):
    ids, _ = reference(kind)
    runner = runner_of(kind)
    result = beam_search(runner, ids, 3, 6)
    sequences, scores = generate_beams(runner_of(kind), ids, 3, 6)
    assert [list(h.ids) for h in result.final] == sequences
    assert [h.score for h in result.final] == pytest.approx(scores, abs=1e-4)


def test_beams_and_speculation_from_the_journeys_cache_equal_them_from_scratch(kind):
    """The app's B and S go on from a copy of the journey's cache (in growing layers): every family's
    cache must copy and grow as its own does."""
    s = greedy_session(kind, steps=3)
    fresh, cached = (beam_search(s.engine, s.ids, 3, 6, from_cache=flag) for flag in (False, True))
    assert [h.ids for h in cached.final] == [h.ids for h in fresh.final]
    assert [h.score for h in cached.final] == pytest.approx([h.score for h in fresh.final], abs=1e-4)
    runs = [
        speculative_decode(s.engine, s.ids, make_drafter("early-exit:1", s.engine), 8, GREEDY, from_cache=flag)
        for flag in (False, True)
    ]
    assert runs[0].ids == runs[1].ids


def test_a_saved_checkpoint_loads_whole_and_its_size_was_counted_before_it_loaded(kind, tmp_path):
    from tokenviz.backends.transformers.loading import load_model
    from tokenviz.backends.transformers.memory import parameter_count

    saved = family_model(kind)
    saved.model.save_pretrained(tmp_path)
    saved.tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu", dtype="float32")  # refused if a weight were missing or extra
    assert parameter_count(loaded.model.config).total == sum(p.numel() for p in loaded.model.parameters())
    ids = torch.tensor([reference(kind)[0]])
    with torch.inference_mode():
        torch.testing.assert_close(loaded.model(ids).logits, saved.model(ids).logits)
