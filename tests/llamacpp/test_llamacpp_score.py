"""`score` on a GGUF in llama.cpp: every prompt token's log-probability, rank and entropy (what
llama-server cannot echo, llama.cpp #8942), equal to those of llama-cpp-python's own Llama fed the text
in one batch with every position's logits kept."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clitools import invoke

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("llama_cpp")]

TEXT = "The Eiffel Tower is located in Paris, the capital of France, on the left bank of the Seine."
# Two float32 log-softmaxes of logits equal bit for bit, in another order of a sum.
SAME = 1e-5


def test_score_gives_each_prompt_tokens_log_probability_rank_and_entropy_as_llama_cpp_computes_them(
    monkeypatch, capsys, reference
):
    code, out, err = invoke(monkeypatch, capsys, "score", TEXT, "--backend", "llama.cpp", "--json")
    assert code == 0, err
    doc = json.loads(out)
    ids = [doc["first"]["id"], *(t["id"] for t in doc["tokens"])]
    assert ids == reference.tokenize(TEXT.encode(), add_bos=True, special=False)
    reference.reset()
    reference.eval(ids)
    rows = np.asarray(reference.scores[: len(ids)], dtype=np.float64)
    for p, token in enumerate(doc["tokens"]):
        logits = rows[p]
        log_probs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        next_id = ids[p + 1]
        assert token["logprob"] == pytest.approx(log_probs[next_id], abs=SAME), p
        assert token["rank"] == 1 + int((logits > logits[next_id]).sum()), p
        bits = -(np.exp(log_probs) * log_probs).sum() / np.log(2)
        assert token["entropy"] == pytest.approx(bits, abs=1e-4), p  # in bits, as score says it
        assert token["top"][0]["id"] == int(logits.argmax()), p
    assert doc["logprob"] == pytest.approx(sum(t["logprob"] for t in doc["tokens"]))
    assert doc["perplexity"] == pytest.approx(np.exp(-doc["logprob"] / len(doc["tokens"])))
