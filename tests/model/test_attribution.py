"""Attribution is the model's own arithmetic: leave-one-out equals recomputing each shortened
sequence directly, on several families and across batches; gradient × input equals a finite
difference; the session keys it to the token that followed; trace adds it to every step."""

import json

import pytest
import torch
from clitools import invoke
from families import family_model
from stock import saved, stock_forward
from tiny import save_tiny, tiny_model

from tokenviz.backends.transformers import attribution as attribution_module
from tokenviz.backends.transformers.attribution import attribute, grad_times_input, leave_one_out
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.journey.session import Session

TEXT = "The Eiffel Tower is located in Paris"


def logprob(model, ids: list[int], target: int) -> float:
    """log p(target | ids) from one full forward pass without the cache, in float64."""
    return float(torch.log_softmax(stock_forward(saved(model), ids).logits[0, -1].double(), -1)[target])


@pytest.mark.parametrize("kind", ["llama", "gpt2", "gemma2", "cohere", "granite", "opt", "bloom"])
def test_leave_one_out_equals_recomputing_each_shortened_sequence(kind):
    loaded = tiny_model(kind) if kind in ("llama", "gpt2") else family_model(kind)
    runner = ModelRunner(loaded)
    ids = runner.encode(TEXT)[:10]
    target = 42
    full, scores = leave_one_out(runner, ids, target)
    assert full == pytest.approx(logprob(loaded.model, ids, target), abs=1e-4)
    assert len(scores) == len(ids)
    for j, score in enumerate(scores):
        without = logprob(loaded.model, ids[:j] + ids[j + 1 :], target)
        assert score == pytest.approx(full - without, abs=1e-4), j


def test_leave_one_out_is_the_same_in_one_batch_or_many(monkeypatch):
    runner = ModelRunner(tiny_model())
    ids = runner.encode(TEXT)
    whole = leave_one_out(runner, ids, 7)
    monkeypatch.setattr(attribution_module, "BATCH_TOKENS", len(ids) * 2)  # two sequences a batch
    seen = []
    batched = leave_one_out(runner, ids, 7, progress=lambda done, total: seen.append((done, total)))
    assert batched[0] == pytest.approx(whole[0], abs=1e-6)
    assert batched[1] == pytest.approx(whole[1], abs=1e-5)
    assert len(seen) == (len(ids) + 1) // 2 and seen[-1] == (len(ids), len(ids))


def test_leave_one_out_can_be_cancelled_and_needs_two_tokens():
    runner = ModelRunner(tiny_model())
    with pytest.raises(Cancelled):
        leave_one_out(runner, runner.encode(TEXT), 7, cancelled=lambda: True)
    with pytest.raises(TokenvizError, match="at least two tokens"):
        leave_one_out(runner, [5], 7)
    with pytest.raises(TokenvizError, match="loo or grad"):
        attribute(runner, [5, 6], 7, "shap")


@pytest.mark.parametrize("kind", ["gpt2", "opt"])
def test_gradient_times_input_equals_a_finite_difference(kind):
    """d/dε log p(target) with embedding j scaled by (1 + ε), at ε = 0, is grad_j · e_j. (In float64,
    on families whose norms stay in float64: an RMSNorm computes in float32 whatever the model's dtype.)"""
    loaded = tiny_model(kind) if kind == "gpt2" else family_model(kind)
    loaded.model.double()
    runner = ModelRunner(loaded)
    ids = runner.encode(TEXT)[:8]
    target = 42
    full, scores = grad_times_input(runner, ids, target)
    model = loaded.model
    with torch.no_grad():
        embeds = model.get_input_embeddings()(torch.tensor([ids]))

        def at(scaled: torch.Tensor) -> float:
            logits = model(inputs_embeds=scaled, use_cache=False).logits[0, -1]
            return float(torch.log_softmax(logits, -1)[target])

        assert full == pytest.approx(at(embeds), abs=1e-12)
        eps = 1e-4
        for j, score in enumerate(scores):
            up, down = embeds.clone(), embeds.clone()
            up[0, j] *= 1 + eps
            down[0, j] *= 1 - eps
            assert score == pytest.approx((at(up) - at(down)) / (2 * eps), rel=1e-6, abs=1e-10), j


@pytest.mark.parametrize("kind", ["llama", "gemma2", "cohere", "granite"])
def test_gradient_times_input_explains_the_models_own_log_probability(kind):
    """Fed as embeddings (Gemma scales them inside the model), the log-probability is the one fed as ids."""
    loaded = tiny_model(kind) if kind == "llama" else family_model(kind)
    runner = ModelRunner(loaded)
    ids = runner.encode(TEXT)[:8]
    full, scores = grad_times_input(runner, ids, 42)
    assert full == pytest.approx(logprob(loaded.model, ids, 42), abs=1e-5)
    assert len(scores) == len(ids) and any(abs(s) > 0 for s in scores)


def test_the_session_explains_the_token_that_followed_each_position():
    loaded = tiny_model()
    session = Session(ModelRunner(loaded))
    session.start(TEXT)
    session.step()
    prompt = session.prompt_ids
    inside = session.analyses.attribute(3, "loo")
    assert inside.target_id == prompt[4] and len(inside.scores) == 4
    assert inside.logprob == pytest.approx(session.records[0].prompt_predictions[3].logprob, abs=1e-4)
    pending = session.analyses.attribute(session.engine.kv_len - 1, "grad")
    assert pending.target_id == session.records[-1].decision.chosen_id
    assert session.analyses.attribute(3, "loo") is inside  # the past does not change: computed once


def test_trace_adds_each_steps_attribution(tmp_path, monkeypatch, capsys):
    model = save_tiny(tmp_path / "tiny")
    args = ("trace", TEXT, "--model", model, "--temperature", "0")
    code, out, err = invoke(monkeypatch, capsys, *args, "--steps", "3", "--json", "--attribution", "loo")
    assert code == 0, err
    doc = json.loads(out)
    n = len(doc["prompt"])
    for i, step in enumerate(doc["steps"]):
        rows = step["attribution"]
        assert [r["position"] for r in rows] == list(range(n + i))
        assert rows[0]["id"] == doc["prompt"][0]["id"] and all(isinstance(r["score"], float) for r in rows)
    code, out, err = invoke(monkeypatch, capsys, *args, "--steps", "2", "--attribution", "grad")
    assert code == 0 and "led" in out and "The@0" in out  # (the header wraps in a narrow terminal)
    code, out, err = invoke(monkeypatch, capsys, *args, "--attribution", "shap")
    assert code == 2 and "loo or grad" in err
