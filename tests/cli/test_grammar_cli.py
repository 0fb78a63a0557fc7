"""The grammar options on the command line: trace, score and compare, and their mistakes in one line."""

import json
import re

import pytest
from clitools import invoke
from tiny import save_tiny


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-llama"), "llama", context=64)


def test_trace_json_lists_the_grammar_stage_with_its_allowed_count_and_removed_mass(monkeypatch, capsys, tiny_dir):
    code, out, _ = invoke(
        monkeypatch, capsys, "trace", "Answer:", "--model", tiny_dir, "--regex", "[0-9]{2}-[a-b]", "--json"
    )
    assert code == 0
    doc = json.loads(out)
    assert re.fullmatch("[0-9]{2}-[a-b]", doc["text"]) and doc["stop_reason"] == "the grammar is complete"
    digest = doc["settings"]["grammar"]["digest"]
    assert doc["grammars"] == {digest: {"kind": "regex", "source": "[0-9]{2}-[a-b]", "text": "[0-9]{2}-[a-b]"}}
    for step in doc["steps"]:
        stage = next(s for s in step["stages"] if s["name"] == "grammar")
        assert stage["grammar"] == "regex [0-9]{2}-[a-b]" and 1 <= stage["allowed"] == stage["kept"]
        assert stage["removed"] == pytest.approx(1 - stage["mass"]) and 0 <= stage["removed"] <= 1
    assert next(s for s in doc["steps"][-1]["stages"] if s["name"] == "grammar")["allowed"] == 2  # a or b


def test_score_gives_each_token_its_log_probability_under_the_grammar(monkeypatch, capsys, tiny_dir):
    code, out, _ = invoke(
        monkeypatch, capsys, "score", "12-ab", "--model", tiny_dir, "--regex", "[0-9]+-[a-b]+", "--json"
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["grammar"]["leaves_at"] is None
    constrained = [t["constrained"] for t in doc["tokens"]]
    assert all(c is not None and c["logprob"] >= t["logprob"] for c, t in zip(constrained, doc["tokens"]))
    assert doc["grammar"]["logprob"] == pytest.approx(sum(c["logprob"] for c in constrained))
    code, out, _ = invoke(
        monkeypatch, capsys, "score", "12-xy", "--model", tiny_dir, "--regex", "[0-9]+-[a-b]+", "--json"
    )
    doc = json.loads(out)
    leaves = doc["grammar"]["leaves_at"]
    assert leaves is not None and doc["grammar"]["logprob"] is None
    assert all((t["constrained"] is None) == (t["index"] >= leaves) for t in doc["tokens"])


def test_compare_against_no_grammar(monkeypatch, capsys, tiny_dir):
    code, out, _ = invoke(
        monkeypatch,
        capsys,
        "compare",
        "Answer:",
        "--model",
        tiny_dir,
        "--regex",
        "[0-9]{4}",
        "--against-grammar",
        "none",
        "-t",
        "0",
        "--steps",
        "4",
        "--json",
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["a"]["settings"]["grammar"]["kind"] == "regex" and doc["b"]["settings"]["grammar"] is None
    assert re.fullmatch("[0-9]{4}", doc["a"]["text"])
    assert any(s["name"] == "grammar" for s in doc["a"]["steps"][0]["stages"])
    assert not any(s["name"] == "grammar" for s in doc["b"]["steps"][0]["stages"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--regex", "("], "the regex ( is not valid"),
        (["--regex", "[0-9]", "--grammar", "g.gbnf"], "give one grammar"),
        (["--json-schema", "/nonexistent/schema.json"], "cannot read the json-schema"),
        (["--regex", "[0-9]+", "--beams", "2"], "beam search does not follow a grammar"),
    ],
)
def test_a_grammar_mistake_is_one_line_and_exit_2(monkeypatch, capsys, tiny_dir, args, message):
    code, out, err = invoke(monkeypatch, capsys, "trace", "Answer:", "--model", tiny_dir, *args)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
