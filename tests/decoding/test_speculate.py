"""Speculative decoding: greedy output equals plain greedy; the accept/reject rule keeps p."""

import json
import sys

import pytest
import torch
from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.backends.transformers.speculation import make_drafter, speculative_decode
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.sampling import draw_uniform
from tokenviz.decoding.speculation import PromptLookup, accept_or_replace
from tokenviz.journey.session import Session

PROMPT = "The cat sat on the mat. The dog sat on the log. The cat sat on the"


def plain_greedy(loaded, prompt, steps):
    s = Session(ModelRunner(loaded), SamplingSettings(temperature=0, max_new_tokens=steps))
    s.start(prompt)
    while s.step() is not None:
        pass
    return s.generated_ids


@pytest.mark.parametrize("spec", ["prompt-lookup", "early-exit:1"])
def test_greedy_speculation_equals_plain_greedy(tiny, spec):
    runner = ModelRunner(tiny)
    ids = runner.encode(PROMPT)
    result = speculative_decode(runner, ids, make_drafter(spec, runner), 16, SamplingSettings(temperature=0))
    assert list(result.ids) == plain_greedy(tiny, PROMPT, 16)[: len(result.ids)]
    assert len(result.ids) == 16 or result.ids[-1] in runner.eos_ids
    assert sum(r.accepted + 1 for r in result.rounds) == len(result.ids)  # each round: accepted + its own token
    assert len(result.rounds) <= 16 and result.tokens_per_forward >= 1.0


def test_a_draft_model_speculates_for_the_target(tiny_llama):
    target = ModelRunner(tiny_llama)
    draft = ModelRunner(tiny_model("llama", seed=1))  # another model, same vocabulary
    drafter = make_drafter("draft-model", target, draft)
    ids = target.encode(PROMPT)
    result = speculative_decode(target, ids, drafter, 12, SamplingSettings(temperature=0))
    assert list(result.ids) == plain_greedy(tiny_llama, PROMPT, 12)
    same = make_drafter("draft-model", target, ModelRunner(tiny_llama))  # the target as its own draft
    perfect = speculative_decode(target, ids, same, 12, SamplingSettings(temperature=0))
    assert perfect.acceptance_rate == 1.0 and perfect.tokens_per_forward > 2


def test_prompt_lookup_proposes_what_followed_the_last_ngram():
    lookup = PromptLookup()
    assert lookup.draft([1, 2, 3, 9, 9, 1, 2, 3], 3) == [9, 9, 1]
    assert lookup.draft([5, 6, 7, 8, 6], 2) == [7, 8]  # falls back to a 1-gram
    assert lookup.draft([1, 2, 3], 2) == []


def test_the_accept_reject_rule_keeps_the_target_distribution():
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    n = 6000
    for drafted in (0, 3):
        counts = torch.zeros(5)
        accepted = 0
        for i in range(n):
            ok, token = accept_or_replace(p, drafted, draw_uniform(1, i), draw_uniform(2, i))
            counts[token] += 1
            accepted += ok
        expected = p * n
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < 18.5, (drafted, counts.tolist())  # 4 degrees of freedom, 0.999 quantile
        assert abs(accepted / n - float(p[drafted])) < 0.03


def test_sampled_speculation_is_reproducible(tiny_llama):
    runner = ModelRunner(tiny_llama)
    ids = runner.encode(PROMPT)
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, seed=4)
    a = speculative_decode(runner, ids, make_drafter("prompt-lookup", runner), 12, settings)
    b = speculative_decode(runner, ids, make_drafter("prompt-lookup", runner), 12, settings)
    assert a == b and len(a.ids) == 12


def test_bad_drafters_are_refused(tiny_llama):
    runner = ModelRunner(tiny_llama)
    for spec, message in [
        ("nonsense", "unknown drafter"),
        ("early-exit:x", "layer number"),
        ("early-exit:99", "1 to 2"),
        ("draft-model", "needs --draft-model"),
    ]:
        with pytest.raises(TokenvizError, match=message):
            make_drafter(spec, runner)


@pytest.mark.bundled
def test_trace_speculate_on_the_bundled_model(monkeypatch, capsys, bundled):
    from tokenviz.cli import run

    prompt = "Paris is the capital of France. Berlin is the capital of Germany. Paris is the capital of"
    monkeypatch.setattr(
        sys,
        "argv",
        ["tokenviz", "trace", prompt, "--speculate", "prompt-lookup", "--steps", "12", "--temperature", "0", "--json"],
    )
    with pytest.raises(SystemExit) as exit_info:
        run()
    assert not exit_info.value.code
    doc = json.loads(capsys.readouterr().out)
    spec = doc["speculation"]
    assert [s["chosen"]["id"] for s in doc["steps"]] == plain_greedy(bundled, prompt, 12)
    assert spec["acceptance_rate"] > 0 and spec["tokens_per_forward"] > 1
    assert all({"drafted", "accepted"} <= r.keys() for r in spec["rounds"])
    early = speculative_decode(
        ModelRunner(bundled),
        ModelRunner(bundled).encode(prompt),
        make_drafter("early-exit:20", ModelRunner(bundled)),
        8,
        SamplingSettings(temperature=0),
    )
    assert list(early.ids) == plain_greedy(bundled, prompt, 8)


def test_trace_with_a_draft_model(monkeypatch, capsys, tmp_path):
    from clitools import invoke
    from tiny import save_tiny

    target = save_tiny(tmp_path / "target", "llama")
    code, out, err = invoke(
        monkeypatch,
        capsys,
        "trace",
        PROMPT,
        "--model",
        target,
        "--draft-model",
        target,
        "--steps",
        "10",
        "--temperature",
        "0",
        "--json",
    )
    assert code == 0, err
    doc = json.loads(out)
    spec = doc["speculation"]
    assert spec["drafter"].startswith("draft model") and spec["acceptance_rate"] == 1.0  # its own draft
    assert spec["tokens_per_forward"] > 1
    from tokenviz.backends.transformers.loading import load_model

    assert [s["chosen"]["id"] for s in doc["steps"]] == plain_greedy(load_model(target, device="cpu"), PROMPT, 10)
    code, _, err = invoke(monkeypatch, capsys, "trace", PROMPT, "--model", target, "--speculate", "early-exit:99")
    assert code == 2 and "early-exit layer must be 1 to 2" in err
