"""Beam search against transformers' generate(num_beams=k)."""

import json
import sys

import pytest
from beamtools import generate_beams

from tokenviz.backends.transformers.beams import beam_search
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.errors import TokenvizError

PROMPT = "The Eiffel Tower is located in"


def assert_beams_equal_generate(loaded, width, steps):
    runner = ModelRunner(loaded)
    ids = runner.encode(PROMPT)
    result = beam_search(runner, ids, width, steps)
    sequences, scores = generate_beams(loaded, ids, width, steps)
    assert [list(h.ids) for h in result.final] == sequences
    assert [h.score for h in result.final] == pytest.approx(scores, abs=1e-4)


@pytest.mark.parametrize("width", [2, 3, 4])
def test_beams_equal_generate_on_a_tiny_model(tiny, width):
    assert_beams_equal_generate(tiny, width, 8)


@pytest.mark.bundled
@pytest.mark.parametrize("width", [2, 4])
def test_beams_equal_generate_on_the_bundled_model(bundled, width):
    assert_beams_equal_generate(bundled, width, 12)


def test_every_step_records_kept_pruned_and_finished(tiny_llama):
    runner = ModelRunner(tiny_llama)
    result = beam_search(runner, runner.encode(PROMPT), 3, 5)
    assert len(result.steps) == 5
    first = result.steps[0]
    assert len(first.beams) == 1  # the search starts from the prompt alone
    assert len(first.candidates) == 2 * 3 and all(c.beam == 0 for c in first.candidates)
    for step in result.steps[:-1]:
        fates = [c.fate for c in step.candidates]
        assert fates.count("kept") + fates.count("finished") >= 3
        scores = [c.score for c in step.candidates]
        assert scores == sorted(scores, reverse=True)
    last = result.steps[-1].candidates
    assert all(c.fate != "kept" for c in last)  # the length limit ends them
    for c in last[:3]:  # the best three end here: with end of text, or at the limit
        assert c.fate == ("finished" if c.id in runner.eos_ids else "at length limit")
    assert all(h.end_of_text == (h.ids[-1] in runner.eos_ids) for h in result.final)
    for step in result.steps:  # each running beam's text, decoded from its ids
        assert step.texts == tuple("".join(runner.piece(t) for t in ids) for ids, _ in step.beams)
    with pytest.raises(TokenvizError, match="2 to 8"):
        beam_search(runner, [1, 2], 9, 3)


@pytest.mark.bundled
def test_trace_beams_json(monkeypatch, capsys):
    from tokenviz.cli import run

    monkeypatch.setattr(sys, "argv", ["tokenviz", "trace", PROMPT, "--beams", "3", "--steps", "6", "--json"])
    with pytest.raises(SystemExit) as exit_info:
        run()
    assert not exit_info.value.code
    doc = json.loads(capsys.readouterr().out)
    beams = doc["beams"]
    assert len(beams["final"]) == 3 and len(beams["steps"]) == 6
    best = beams["final"][0]
    assert best["logprob"] >= beams["final"][1]["logprob"] - 1e-9 or best["score"] >= beams["final"][1]["score"]
    assert doc["text"] == best["text"] and [s["chosen"]["id"] for s in doc["steps"]] == best["ids"]
