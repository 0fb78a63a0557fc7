"""Interventions on the command line: trace --ablate, --steer, --steer-tokens, each step's unsteered
distribution, and their mistakes in one line before the model loads."""

import json

import pytest
from clitools import invoke
from tiny import save_tiny


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-llama"), "llama", context=64)


def test_trace_gives_each_step_the_unsteered_distribution_and_its_kl(monkeypatch, capsys, tiny_dir):
    args = ["trace", "The cat sat", "--model", tiny_dir, "-t", "0", "--steps", "3", "--json"]
    code, out, _ = invoke(monkeypatch, capsys, *args, "--ablate", "1.2", "--steer-tokens", "1:3:a:b")
    assert code == 0
    doc = json.loads(out)
    for step in doc["steps"]:
        assert step["interventions"] == ["ablate L1.H2 (zero)", "steer L1 ×3 toward 'a' away from 'b'"]
        assert step["unsteered"]["kl"] > 0 and len(step["unsteered"]["top"]) == len(step["top"])
    code, out, _ = invoke(monkeypatch, capsys, *args)
    plain = json.loads(out)
    assert "unsteered" not in plain["steps"][0]  # no intervention: the step as it always was
    own, model = doc["steps"][0]["unsteered"]["top"], plain["steps"][0]["top"]  # the model's own, at the prompt
    assert [c["id"] for c in own] == [c["id"] for c in model]
    assert [c["logit"] for c in own] == pytest.approx([c["logit"] for c in model], abs=1e-5)


def test_the_trace_table_names_the_interventions_in_force(monkeypatch, capsys, tiny_dir):
    args = ["trace", "The cat sat", "--model", tiny_dir, "-t", "0", "--steps", "2", "--ablate", "1.2"]
    code, out, _ = invoke(monkeypatch, capsys, *args)
    assert code == 0 and "interventions in force: ablate L1.H2 (zero)" in out and "KL from own" in out
    code, out, _ = invoke(monkeypatch, capsys, *args[:-2])
    assert code == 0 and "interventions in force" not in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ablate", "1"], "--ablate takes LAYER.HEAD"),
        (["--ablate-mean"], "--ablate-mean goes with --ablate"),
        (["--steer", "1:x:a:b"], "SCALE a number"),
        (["--steer-tokens", "1:2:a"], "LAYER:SCALE:TOWARD:AWAY"),
        (["--ablate", "9.0"], "the model's layers are 0-"),
        (["--steer-tokens", "1:2:abcdef:b"], "not one"),
    ],
)
def test_an_intervention_mistake_is_one_line_and_exit_2(monkeypatch, capsys, tiny_dir, args, message):
    code, out, err = invoke(monkeypatch, capsys, "trace", "The cat sat", "--model", tiny_dir, *args)
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err and err.count("error:") == 1
