"""`score --against-backend server`: a text scored against the model a real vLLM server runs (its top N
only), in llama-perplexity's terms: every figure a top N allows (the perplexities and their ratio, Δp,
same top p), the server's own log-probabilities asked of it outside tokenviz; the KLD, a sum over every
token, named as not given in the document, the table and the page."""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch
from clitools import invoke
from stock import saved, stock_forward
from test_served import KEY_ENV, SERVED_TOLERANCE

from tokenviz.decoding.perplexity_statistics import KLD_NOT_GIVEN

pytestmark = [pytest.mark.served, pytest.mark.bundled]

WINDOW = 64
TEXT = (
    "The harbour town woke slowly. Fishing boats came in before the light, their engines low, and the gulls "
    "followed them as they always had, crying over the nets. By seven the bakery on the corner had its doors "
    "open and the smell of bread reached the water. Old men sat on the wall by the slipway and argued about the "
    "weather, which they agreed was worse than it used to be, though none of them could say when it had been "
    "better. At noon the ferry left for the island with eleven passengers, a van of building supplies and a "
    "crate of hens. The crossing took forty minutes, and the captain looked at the sky before he cast off."
)


def server_logprobs(vllm_server, ids: list[int]) -> list[float]:
    """The server's own log-probability of each token of `ids` after the first (its prompt_logprobs)."""
    auth = {"Authorization": f"Bearer {vllm_server.key}"}
    model = httpx.get(f"{vllm_server.url}/models", headers=auth).json()["data"][0]["id"]
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
    entries = httpx.post(f"{vllm_server.url}/completions", json=body, headers=auth, timeout=120).json()
    prompt = entries["choices"][0]["prompt_logprobs"]
    return [entry[str(token)]["logprob"] for entry, token in zip(prompt[1:], ids[1:], strict=True)]


def test_a_text_scored_against_a_served_base_gives_what_a_top_n_allows(
    monkeypatch, capsys, vllm_server, bundled, tmp_path
):
    """The bundled model here (float32) as Q against the server's copy as the base: each scored token's Δp
    is Q's probability minus the server's own (asked here of the server, window by window), Q's perplexity
    that of the same windows scored against itself here; the KLD figures null and named; the table and the
    page say so and order the tails by |Δp|."""
    monkeypatch.setenv(KEY_ENV, vllm_server.key)
    served = ["--against-backend", "server", "--endpoint", vllm_server.url, "--api-key-env", KEY_ENV]
    local = ["score", TEXT, "--dtype", "float32", "--device", "cpu", "--window", str(WINDOW)]
    code, out, err = invoke(monkeypatch, capsys, *local, *served, "--json")
    assert code == 0, err
    doc = json.loads(out)
    s = doc["statistics"]
    assert doc["windows"] >= 2 and s["count"] == doc["windows"] * (WINDOW // 2 - 1)
    assert s["not_given"] == [KLD_NOT_GIVEN] and all(s[name] is None for name in s if "kld" in name)
    assert doc["tails"]["by_kld"] == [] and len(doc["tails"]["by_dp"]) == 10
    assert all(k is None for k in doc["scored"]["kld"])
    code, own, err = invoke(monkeypatch, capsys, *local, "--against-backend", "transformers", "--json")
    assert code == 0, err
    itself = json.loads(own)
    assert itself["statistics"]["mean_kld"] == pytest.approx(0.0, abs=1e-4)  # (Q against itself, here)
    assert s["ppl_q"] == pytest.approx(itself["statistics"]["ppl_q"], rel=1e-6)  # Q's side is the same either way
    assert s["ppl_ratio"] == pytest.approx(1.0, abs=SERVED_TOLERANCE) and s["rms_dp"] < SERVED_TOLERANCE
    assert s["same_top_p"] >= 0.95  # (one model: a near tie may break the other way on the server's kernels)
    # each Δp: Q's probability (transformers' own forward pass over the window, here) minus the server's
    ids = served_ids(vllm_server)
    assert len(ids) == doc["tokens"]  # (this tokenizer adds no BOS: each window is the text's own tokens)
    first, dp = WINDOW // 2, dict(zip(doc["scored"]["index"], doc["scored"]["dp"], strict=True))
    for w in range(doc["windows"]):
        window = ids[w * WINDOW : (w + 1) * WINDOW]
        theirs = server_logprobs(vllm_server, window)
        q = torch.log_softmax(stock_forward(saved(bundled.model), window).logits[0].double(), -1)
        for place in range(first + 1, WINDOW):
            p_q, p_base = math.exp(float(q[place - 1, window[place]])), math.exp(theirs[place - 1])
            assert dp[w * WINDOW + place] == pytest.approx(p_q - p_base, abs=1e-4), (w, place)
    code, out, err = invoke(monkeypatch, capsys, *local, *served, "--html", str(tmp_path / "page.html"))
    assert code == 0, err
    said = " ".join(out.split())
    assert f"not given: {KLD_NOT_GIVEN}" in said and "where they differ most, by |Δp|" in said
    page = (tmp_path / "page.html").read_text()
    assert "by |Δp|" in page and "a side gave its top N only: no KLD" in page


def served_ids(vllm_server) -> list[int]:
    """The text's tokens as the server's tokenizer gives them (its /tokenize)."""
    auth = {"Authorization": f"Bearer {vllm_server.key}"}
    model = httpx.get(f"{vllm_server.url}/models", headers=auth).json()["data"][0]["id"]
    root = vllm_server.url.removesuffix("/v1")
    return httpx.post(f"{root}/tokenize", json={"model": model, "prompt": TEXT}, headers=auth).json()["tokens"]
