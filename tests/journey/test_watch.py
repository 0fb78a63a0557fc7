"""Watched tokens are followed with the model's own numbers: at every step their raw probability and
rank equal a full recompute, their final probability the recorded stages; pinning late fills the
steps already taken with the same figures; the lens follows them; trace --watch prints them."""

import json

import pytest
import torch
from clitools import invoke
from families import family_model
from stock import saved, stock_forward
from tiny import save_tiny, tiny_model
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper

from tokenviz.backends.transformers.lens import lens_logits, residual_stream
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session
from tokenviz.journey.watching import token_of

PROMPT = "The Eiffel Tower is located in"
SETTINGS = SamplingSettings(temperature=0.7, top_k=5, top_p=1.0, seed=11)


def journey(loaded, pinned=(), steps=6, settings=SETTINGS) -> Session:
    session = Session(ModelRunner(loaded), settings)
    session.pin(pinned)
    session.start(PROMPT)
    for _ in range(steps):
        session.step()
    return session


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_each_step_follows_the_watched_tokens_with_the_models_own_numbers(kind):
    loaded = tiny_model(kind)
    session = journey(loaded, pinned=(42, 7, 200))
    processors = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(5)])
    for record in session.records:
        context = session.ids[: record.position]
        logits = stock_forward(saved(loaded.model), context).logits[0, -1].double()
        raw = torch.softmax(logits, -1)
        final = torch.softmax(processors(torch.tensor([context]), logits[None].float())[0].double(), -1)
        assert [p.id for p in record.decision.pinned] == [42, 7, 200]
        for p in record.decision.pinned:
            assert p.prob == pytest.approx(float(raw[p.id]), abs=1e-5)
            assert p.final_prob == pytest.approx(float(final[p.id]), abs=1e-5)
            assert p.rank == int((raw > raw[p.id]).sum()) + 1
        chosen = record.decision.chosen_id  # watching the chosen token gives the decision's own figures
        assert raw[chosen] == pytest.approx(record.decision.raw_prob, abs=1e-5)


def test_greedy_steps_give_watched_tokens_a_one_hot_final_probability():
    session = journey(tiny_model(), steps=3, settings=SamplingSettings(temperature=0))
    session.pin([session.records[-1].decision.chosen_id, 42])
    finals = [p.final_prob for p in session.records[-1].decision.pinned]
    assert finals == [1.0, 0.0]


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])  # sliding windows refill over a kept cache too
def test_watching_later_fills_the_steps_taken_with_the_same_figures(kind):
    loaded = tiny_model(kind) if kind == "llama" else family_model(kind)
    from_start = journey(loaded, pinned=(42, 7), steps=9)
    later = journey(loaded, steps=9)
    cached = later.engine.kv_len
    later.pin([42, 7])
    for a, b in zip(from_start.records, later.records, strict=True):
        for x, y in zip(a.decision.pinned, b.decision.pinned, strict=True):
            assert (x.id, x.rank) == (y.id, y.rank)
            assert x.prob == pytest.approx(y.prob, abs=1e-5) and x.final_prob == pytest.approx(y.final_prob, abs=1e-5)
    assert later.engine.kv_len == cached  # the cache is left as it was
    later.rewind(2)  # and the steps from it are the ones they would have been
    from_start.rewind(2)
    later.step()
    from_start.step()
    assert later.ids == from_start.ids
    assert later.records[-1].decision == from_start.records[-1].decision


def test_watch_toggles_names_tokens_by_text_or_id_and_refuses_clearly(tiny_llama):
    session = Session(ModelRunner(tiny_llama))
    session.start(PROMPT)
    runner = session.engine
    piece = runner.piece(session.prompt_ids[1])
    one = runner.encode(piece)
    assert len(one) == 1
    assert token_of(runner, piece) == one[0] == token_of(runner, f"id:{one[0]}") == token_of(runner, one[0])
    session.watch(piece)
    session.watch("id:9")
    assert session.pinned == (one[0], 9)
    assert [p.id for p in session.records[-1].decision.pinned] == [one[0], 9]
    session.watch(piece)  # again: unwatched
    assert session.pinned == (9,)
    with pytest.raises(TokenvizError, match="not one"):
        token_of(runner, PROMPT)
    with pytest.raises(TokenvizError, match="outside the vocabulary"):
        token_of(runner, "id:99999")
    with pytest.raises(TokenvizError, match="id:42"):
        token_of(runner, "id:x")
    for t in (1, 2, 3):
        session.watch(t)
    with pytest.raises(TokenvizError, match="at most 4"):
        session.watch(4)


def test_the_lens_follows_the_watched_tokens_as_the_lens_computes_them(tiny_llama):
    session = journey(tiny_llama, pinned=(42, 7), steps=2)
    position = session.engine.kv_len - 1
    inspection = session.analyses.inspect(position)
    probs = torch.softmax(lens_logits(session.engine, residual_stream(session.engine, session.ids)[0][:, position]), -1)
    assert inspection.pinned == ((42, session.engine.piece(42)), (7, session.engine.piece(7)))
    for layer, row in enumerate(inspection.lens):
        for token, (rank, prob) in zip((42, 7), row.pinned):
            assert prob == pytest.approx(float(probs[layer, token]), abs=1e-6)
            assert rank == int((probs[layer] > probs[layer, token]).sum()) + 1


def test_trace_watch_adds_each_steps_watched_tokens_and_their_split(tmp_path, monkeypatch, capsys):
    model = save_tiny(tmp_path / "tiny")
    args = ("trace", PROMPT, "--model", model, "--temperature", "0", "--steps", "3")
    code, out, err = invoke(monkeypatch, capsys, *args, "--json", "--watch", "id:42", "--watch", "id:7")
    assert code == 0, err
    doc = json.loads(out)
    for step in doc["steps"]:
        assert [w["id"] for w in step["watch"]] == [42, 7]
        assert set(step["watch"][0]) == {"id", "text", "prob", "final_prob", "rank"}
        split = step["logit_difference"]
        shares = split["embedding"] + split["bias"] + split["softcap"]
        shares += sum(layer["attention"] + layer["mlp"] for layer in split["layers"])
        assert shares == pytest.approx(split["total"], abs=1e-4)
    code, out, err = invoke(monkeypatch, capsys, *args, "--watch", "id:42")
    assert code == 0 and "watch" in out and f"#{doc['steps'][-1]['watch'][0]['rank']}" in out
    code, out, err = invoke(monkeypatch, capsys, *args, "--watch", "id:x")
    assert code == 2 and "id:42" in err and "Traceback" not in err


def test_filling_in_goes_by_chunks_with_progress_and_can_be_cancelled(monkeypatch):
    from tokenviz.contract.errors import Cancelled
    from tokenviz.journey import memory_policy

    loaded = tiny_model()
    whole = journey(loaded, steps=9)
    whole.pin([42])
    chunked = journey(loaded, steps=9)
    monkeypatch.setattr(memory_policy, "PREFILL_CHUNK", 4)  # 10 steps: chunks of 4, 4 and 2
    seen = []
    chunked.pin([42], progress=lambda done, total: seen.append((done, total)))
    assert seen == [(4, 10), (8, 10), (10, 10)]
    for a, b in zip(chunked.records, whole.records, strict=True):  # the same figures, to rounding
        (x,), (y,) = a.decision.pinned, b.decision.pinned
        assert (x.id, x.rank, x.final_prob) == (y.id, y.rank, y.final_prob) and x.prob == pytest.approx(
            y.prob, rel=1e-5
        )
    before = list(chunked.records)
    with pytest.raises(Cancelled):
        chunked.pin([42, 7], cancelled=lambda: True)
    assert chunked.pinned == (42,) and chunked.records == before  # as they were


def test_the_logit_split_follows_the_two_tokens_watched_last():
    """Watch three tokens: the split is of the second and third, the pair just chosen, not a token
    watched earlier for another purpose."""
    from tiny import tiny_model

    from tokenviz.backends.transformers.runner import ModelRunner
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session

    session = Session(ModelRunner(tiny_model("llama")), SamplingSettings(temperature=0))
    session.start("The cat sat on the mat. The dog")
    session.pin([5, 9, 11])
    split = session.analyses.logit_difference(len(session.prompt_ids) - 1)
    assert (split.a_id, split.b_id) == (9, 11)
