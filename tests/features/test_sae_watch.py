"""A feature followed through the journey (`trace --sae DIR --watch feature:SAE:ID`): each step gains its
activation at the position whose pass gave the step, the SAE's encode of the residual transformers computes
there; a saved journey keeps it (replay --json prints it again); a feature that is not there is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from clitools import invoke
from sae_folders import saelens_sae
from safetensors.torch import load_file
from tiny import save_tiny

pytestmark = pytest.mark.features

LAYER, STEPS = 1, 5
PROMPT = "The Eiffel Tower is located in"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return save_tiny(tmp_path_factory.mktemp("tiny-sae-watch"), "llama", context=64)


@pytest.fixture(scope="module")
def sae(tiny_dir, tmp_path_factory) -> Path:
    hidden = int(json.loads(Path(tiny_dir, "config.json").read_text())["hidden_size"])
    return saelens_sae(tmp_path_factory.mktemp("saes") / "sae-w", "jumprelu", hidden, 11, LAYER)


def run(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    return invoke(monkeypatch, capsys, "trace", PROMPT, "--steps", str(STEPS), "--temperature", "0", *args)


def test_a_watched_feature_is_its_saes_encode_at_every_step(monkeypatch, capsys, tiny_dir, sae, tmp_path):
    from transformers import AutoModelForCausalLM

    saved = tmp_path / "watched.json"
    args = ["--model", tiny_dir, "--sae", str(sae), "--json", "--save", str(saved)]
    code, out, err = run(monkeypatch, capsys, *args, "--watch", "feature:sae-w:3", "--watch", "feature:sae-w:40")
    assert code == 0, err
    doc = json.loads(out)
    ids = [t["id"] for t in doc["prompt"]] + [s["chosen"]["id"] for s in doc["steps"]]
    positions = [len(doc["prompt"]) - 1 + i for i in range(STEPS)]
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    with torch.no_grad():
        x = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[LAYER + 1][0, positions]
    w = load_file(str(sae / "sae_weights.safetensors"))
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    theirs = torch.relu(pre) * (pre > w["threshold"])  # JumpReLU, as SAELens defines it
    for i, step in enumerate(doc["steps"]):
        followed = {(f["sae"], f["id"]): f["activation"] for f in step["watched_features"]}
        assert set(followed) == {("sae-w", 3), ("sae-w", 40)}
        for (_, feature), activation in followed.items():
            assert activation == pytest.approx(float(theirs[i, feature]), rel=1e-4, abs=1e-5)
    assert any(f["activation"] > 0 for s in doc["steps"] for f in s["watched_features"])
    kept = json.loads(saved.read_text())["step_views"]
    assert [v["watched_features"] for v in kept] == [s["watched_features"] for s in doc["steps"]]
    code, out, err = invoke(monkeypatch, capsys, "replay", str(saved), "--verify")
    assert code == 0 and "verified" in out, err
    code, out, err = invoke(monkeypatch, capsys, "replay", str(saved), "--json")
    assert code == 0 and json.loads(out)["steps"][1]["watched_features"] == doc["steps"][1]["watched_features"], err


@pytest.mark.parametrize(
    "watch, said",
    [
        ("feature:nope:1", "no SAE named 'nope' is loaded (sae-w)"),
        ("feature:sae-w:64", "sae-w has features 0-63: no feature 64"),
        ("feature:sae-w:x", "a feature is watched as feature:SAE:ID"),
    ],
)
def test_a_watched_feature_that_is_not_there_is_one_line(monkeypatch, capsys, tiny_dir, sae, watch, said):
    code, _out, err = run(monkeypatch, capsys, "--model", tiny_dir, "--sae", str(sae), "--watch", watch)
    assert code == 2 and said in err.strip().splitlines()[-1] and "Traceback" not in err, err


def test_a_watched_feature_without_an_sae_names_the_option(monkeypatch, capsys, tiny_dir):
    code, _out, err = run(monkeypatch, capsys, "--model", tiny_dir, "--watch", "feature:sae-w:3")
    assert code == 2 and "--watch feature:SAE:ID follows a feature of an SAE given with --sae DIR" in err, err
