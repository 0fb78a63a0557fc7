"""Scoring a text: every figure equals a full forward pass's log-softmax, on several families and
across the prefill's chunks; and the command line prints it as a table or strict JSON."""

import json
import math

import pytest
import torch
from clitools import invoke
from families import family_model
from stock import saved, stock_forward
from tiny import save_tiny, tiny_chat_model, tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.journey import memory_policy
from tokenviz.journey.score import score_text
from tokenviz.journey.session import Session

TEXT = "The Eiffel Tower is located in Paris, the capital of France."


def reference(loaded, ids: list[int]) -> torch.Tensor:
    """Log-softmax of one full forward pass without the cache."""
    return torch.log_softmax(stock_forward(saved(loaded.model), ids).logits[0].double(), -1)


@pytest.mark.parametrize("kind", ["llama", "gpt2", "gemma2", "opt", "bloom"])
def test_every_token_is_scored_as_a_full_forward_pass_scores_it(kind):
    loaded = tiny_model(kind) if kind in ("llama", "gpt2") else family_model(kind)
    doc = score_text(Session(ModelRunner(loaded)), TEXT)
    ids = [doc["first"]["id"]] + [t["id"] for t in doc["tokens"]]
    logp = reference(loaded, ids)
    for t in doc["tokens"]:
        row = logp[t["index"] - 1]
        assert t["logprob"] == pytest.approx(float(row[t["id"]]), abs=1e-5)
        assert t["prob"] == pytest.approx(math.exp(float(row[t["id"]])), abs=1e-6)
        assert t["rank"] == int((row > row[t["id"]]).sum()) + 1
        probs = row.exp()
        assert t["entropy"] == pytest.approx(float(-(probs * row).sum() / math.log(2)), abs=1e-4)
        assert t["top"][0]["id"] == int(row.argmax())
    assert doc["logprob"] == pytest.approx(sum(t["logprob"] for t in doc["tokens"]), abs=1e-9)
    assert doc["perplexity"] == pytest.approx(math.exp(-doc["logprob"] / len(doc["tokens"])))


def test_a_text_longer_than_one_prefill_chunk_scores_the_same(monkeypatch):
    monkeypatch.setattr(memory_policy, "PREFILL_CHUNK", 7)  # several chunks for a short text
    loaded = tiny_model()
    doc = score_text(Session(ModelRunner(loaded)), TEXT)
    ids = [doc["first"]["id"]] + [t["id"] for t in doc["tokens"]]
    logp = reference(loaded, ids)
    assert len(ids) > 14
    for t in doc["tokens"]:
        assert t["logprob"] == pytest.approx(float(logp[t["index"] - 1, t["id"]]), abs=1e-5)


def test_a_chat_message_is_scored_with_its_template_marked_and_counted_apart():
    doc = score_text(Session(ModelRunner(tiny_chat_model())), "Hello there", chat=True)
    marked = [t for t in doc["tokens"] if t.get("template")]
    own = [t for t in doc["tokens"] if not t.get("template")]
    assert marked and own
    assert doc["scored"] == len(own) and doc["template"]["tokens"] == len(marked)
    assert doc["logprob"] == pytest.approx(sum(t["logprob"] for t in own), abs=1e-9)  # the text's own
    assert doc["perplexity"] == pytest.approx(math.exp(-doc["logprob"] / len(own)))
    assert doc["template"]["logprob"] == pytest.approx(sum(t["logprob"] for t in marked), abs=1e-9)


def test_score_on_the_command_line(monkeypatch, capsys, tmp_path):
    directory = save_tiny(tmp_path / "tiny")
    code, out, err = invoke(monkeypatch, capsys, "score", TEXT, "--model", directory, "--json")
    assert code == 0, err
    doc = json.loads(out)
    keys = {"model", "not_given", "first", "tokens", "scored", "logprob", "perplexity", "template"}
    assert set(doc) == keys and doc["tokens"] and doc["not_given"] == {}  # (a local model gives every field)
    assert all(t["entropy"] == t["entropy_floor"] for t in doc["tokens"])  # (the whole vocabulary's: exact)
    assert doc["scored"] == len(doc["tokens"]) and doc["template"] == {"tokens": 0, "logprob": 0}
    code, out, err = invoke(monkeypatch, capsys, "score", TEXT, "--model", directory)
    assert code == 0 and "perplexity" in out
    # each unit named (UX 7's 24: log-probabilities in nats beside entropies in bits, neither said)
    assert "(nats)" in out and "(bits)" in out and " nats over " in " ".join(out.split())
    code, _, err = invoke(monkeypatch, capsys, "score", "", "--model", directory)
    assert code == 2 and err.count("error:") == 1
