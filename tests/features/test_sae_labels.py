"""Features labelled from what the model and the SAE hold (`trace --sae DIR --json`'s `sae_labels`): the tokens
a feature's decoder row promotes and suppresses most through transformers' own final norm and head; its
top-activating contexts after `tokenviz sae-index DIR --text FILE`, each the SAE's encode of the residual
transformers computes there; Neuronpedia's descriptions where its export is beside the SAE, their text made
safe; a notes file that is not one is one line."""

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

LAYER = 1
PROMPT = "The Eiffel Tower is located in"
TEXT = "The quick brown fox jumps over the lazy dog. " * 6 + "Paris is the capital of France, and Rome of Italy. " * 4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return save_tiny(tmp_path_factory.mktemp("tiny-sae-labels"), "llama", context=64)


def new_sae(tiny_dir: str, folder: Path) -> Path:
    hidden = int(json.loads(Path(tiny_dir, "config.json").read_text())["hidden_size"])
    return saelens_sae(folder, "jumprelu", hidden, 5, LAYER)


def trace(monkeypatch, capsys, tiny_dir: str, sae: Path) -> dict:
    args = ["trace", PROMPT, "--model", tiny_dir, "--steps", "3", "--temperature", "0", "--sae", str(sae), "--json"]
    code, out, err = invoke(monkeypatch, capsys, *args)
    assert code == 0, err
    return json.loads(out)


def test_a_features_label_is_its_decoder_row_through_the_models_own_norm_and_head(
    monkeypatch, capsys, tiny_dir, tmp_path
):
    from transformers import AutoModelForCausalLM

    sae = new_sae(tiny_dir, tmp_path / "sae-l")
    doc = trace(monkeypatch, capsys, tiny_dir, sae)
    on = {f["id"] for step in doc["steps"] for f in step["sae"][0]["features"]}
    labels = {label["id"]: label for label in doc["sae_labels"]}
    assert set(labels) == on and all(label["sae"] == "sae-l" for label in labels.values())
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    rows = load_file(str(sae / "sae_weights.safetensors"))["W_dec"]
    with torch.no_grad():
        logits = model.lm_head(model.model.norm(rows))  # transformers' own final norm and head
    for feature, label in labels.items():
        assert label["promote_ids"] == logits[feature].topk(5).indices.tolist()
        assert label["suppress_ids"] == (-logits[feature]).topk(5).indices.tolist()
        assert len(label["promotes"]) == 5 and label["description"] == "" and label["contexts"] == []


def test_sae_index_keeps_each_features_strongest_contexts_beside_the_sae(monkeypatch, capsys, tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sae = new_sae(tiny_dir, tmp_path / "sae-i")
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    code, out, err = invoke(monkeypatch, capsys, "sae-index", str(sae), "--text", str(text), "--model", tiny_dir)
    assert code == 0 and "tokenviz-index.json" in out, err
    index = json.loads((sae / "tokenviz-index.json").read_text())
    assert index["format"] == "tokenviz-sae-index/1" and index["sae"] == "sae-i" and index["layer"] == LAYER
    # The model's context is 64 tokens: the text is read in windows of 64, each window's first left out.
    ids = AutoTokenizer.from_pretrained(tiny_dir)(TEXT)["input_ids"]
    assert index["tokens"] == len(ids)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    w = load_file(str(sae / "sae_weights.safetensors"))
    acts = []
    with torch.no_grad():
        for start in range(0, len(ids), 64):
            part = ids[start : start + 64]
            x = model(torch.tensor([part]), output_hidden_states=True).hidden_states[LAYER + 1][0, 1:]
            pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
            acts.append(torch.relu(pre) * (pre > w["threshold"]))
    theirs = torch.cat(acts)
    active = torch.nonzero(theirs.max(0).values > 0).flatten().tolist()
    assert sorted(int(k) for k in index["features"]) == active
    for feature in active:
        entries = index["features"][str(feature)]
        expected = theirs[:, feature].topk(min(5, int((theirs[:, feature] > 0).sum()))).values.tolist()
        assert [e["activation"] for e in entries] == pytest.approx(expected, rel=1e-4, abs=1e-5)
        assert all("«" in e["context"] and "»" in e["context"] for e in entries)
    doc = trace(monkeypatch, capsys, tiny_dir, sae)
    label = doc["sae_labels"][0]
    assert label["contexts"] == [e["context"] for e in index["features"][str(label["id"])]]


def test_neuronpedias_descriptions_are_read_beside_the_sae_and_made_safe(monkeypatch, capsys, tiny_dir, tmp_path):
    sae = new_sae(tiny_dir, tmp_path / "sae-n")
    doc = trace(monkeypatch, capsys, tiny_dir, sae)
    feature = doc["sae_labels"][0]["id"]
    explanations = [
        {
            "modelId": "tiny",
            "layer": "1-res",
            "index": str(feature),
            "description": "capitals\x1b]52;c;x\x07 of  Europe",
        },
        {"index": "999999", "description": "past the SAE's features", "modelId": "tiny"},
    ]
    (sae / "neuronpedia.json").write_text(json.dumps(explanations))
    labels = {label["id"]: label for label in trace(monkeypatch, capsys, tiny_dir, sae)["sae_labels"]}
    said = labels[feature]["description"]
    assert said.startswith("capitals") and said.endswith("of Europe") and "\x1b" not in said and "\x07" not in said
    (sae / "neuronpedia.json").write_text(json.dumps({"not": "a list"}))
    args = ["trace", PROMPT, "--model", tiny_dir, "--steps", "1", "--sae", str(sae)]
    code, _out, err = invoke(monkeypatch, capsys, *args)
    assert code == 2 and "neuronpedia.json is not Neuronpedia's export of explanations" in err, err
    assert err.count("error:") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "case, said",
    [
        ("latin1", "is not UTF-8"),
        ("no sae", "holds no SAE"),
        ("window", "--window must be at least 2"),
        ("short", "too short to index"),
    ],
)
def test_sae_index_mistakes_are_one_line(monkeypatch, capsys, tiny_dir, tmp_path, case, said):
    sae = new_sae(tiny_dir, tmp_path / "sae-m")
    text = tmp_path / "text.txt"
    text.write_bytes("café".encode("latin-1") if case == "latin1" else b"x" if case == "short" else TEXT.encode())
    (tmp_path / "empty").mkdir()
    folder = tmp_path / "empty" if case == "no sae" else sae
    more = ["--window", "1"] if case == "window" else []
    code, _, err = invoke(
        monkeypatch, capsys, "sae-index", str(folder), "--text", str(text), "--model", tiny_dir, *more
    )
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and said in errors[0] and "Traceback" not in err, err
    assert not (sae / "tokenviz-index.json").exists()
