"""Steering and clamping by an SAE's feature (`trace --sae DIR --sae-steer SAE:ID:S`, `--sae-clamp SAE:ID:V`) on
the transformers backend, held to transformers' own model with a forward hook of the test's making, run by a
full recompute a token at a time: the steering adds S times the feature's decoder row after the SAE's layer,
the clamp moves each position's residual by (V - the feature's activation there) times that row, the
activation computed here from the SAE's weights as its architecture defines it. A mistake is one line."""

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
TOLERANCE = 1e-4  # a logit: tokenviz's cached float32 steps against a full recompute (sums in another order)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return save_tiny(tmp_path_factory.mktemp("tiny-sae-edit"), "llama", context=64)


@pytest.fixture(scope="module")
def saes(tiny_dir, tmp_path_factory) -> dict[str, str]:
    hidden = int(json.loads(Path(tiny_dir, "config.json").read_text())["hidden_size"])
    root = tmp_path_factory.mktemp("saes")
    return {
        a: str(saelens_sae(root / f"sae-{a}", a, hidden, seed, LAYER)) for seed, a in enumerate(("standard", "topk"))
    }


def encode_one(w: dict[str, torch.Tensor], x: torch.Tensor, feature: int, architecture: str) -> torch.Tensor:
    """The feature's activation at each row of `x`, as SAELens defines the architecture (no rescaling)."""
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    if architecture == "topk":
        kept = torch.zeros_like(pre).scatter(-1, torch.topk(pre, 8, dim=-1).indices, 1.0)
        return (torch.relu(pre) * kept)[..., feature]
    return torch.relu(pre)[..., feature]


def reference_steps(tiny_dir: str, ids: list[int], change, steps: int = STEPS) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy steps of transformers' model with `change` applied to the output of layer LAYER, each step a
    full recompute of the tokens so far: the tokens, and each step's logits."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    hook = model.model.layers[LAYER].register_forward_hook(
        lambda m, a, out: (change(out[0]), *out[1:]) if isinstance(out, tuple) else change(out)
    )
    tokens, logits = list(ids), []
    try:
        with torch.no_grad():
            for _ in range(steps):
                row = model(torch.tensor([tokens])).logits[0, -1]
                logits.append(row)
                tokens.append(int(row.argmax()))
    finally:
        hook.remove()
    return tokens[len(ids) :], logits


def trace(monkeypatch, capsys, tiny_dir: str, *more: str) -> dict:
    args = ["trace", PROMPT, "--model", tiny_dir, "--steps", str(STEPS), "--temperature", "0", "--json", *more]
    code, out, err = invoke(monkeypatch, capsys, *args)
    assert code == 0, err
    return json.loads(out)


def assert_steps(doc: dict, tokens: list[int], logits: list[torch.Tensor]) -> None:
    assert [s["chosen"]["id"] for s in doc["steps"]] == tokens
    for step, row in zip(doc["steps"], logits):
        for entry in step["top"][:10]:
            assert entry["logit"] == pytest.approx(float(row[entry["id"]]), abs=TOLERANCE)


def test_steering_by_a_feature_adds_its_decoder_row_after_its_layer(monkeypatch, capsys, tiny_dir, saes):
    w = load_file(f"{saes['standard']}/sae_weights.safetensors")
    plain = trace(monkeypatch, capsys, tiny_dir)
    ids = [t["id"] for t in plain["prompt"]]
    doc = trace(monkeypatch, capsys, tiny_dir, "--sae", saes["standard"], "--sae-steer", "sae-standard:5:40")
    assert_steps(doc, *reference_steps(tiny_dir, ids, lambda h: h + 40.0 * w["W_dec"][5]))
    assert doc["steps"][0]["interventions"] == ["steer L1 ×40 by sae-standard#5"]
    assert doc["steps"][0]["unsteered"]["top"][0]["id"] == plain["steps"][0]["top"][0]["id"]  # its own beside
    assert [s["chosen"]["id"] for s in doc["steps"]] != [s["chosen"]["id"] for s in plain["steps"]]


@pytest.mark.parametrize("architecture", ["standard", "topk"])
def test_clamping_a_feature_sets_its_activation_and_keeps_the_rest(monkeypatch, capsys, tiny_dir, saes, architecture):
    folder = saes[architecture]
    w = load_file(f"{folder}/sae_weights.safetensors")
    plain = trace(monkeypatch, capsys, tiny_dir, "--sae", folder)
    ids = [t["id"] for t in plain["prompt"]]
    feature = plain["steps"][0]["sae"][0]["features"][0]["id"]  # on at the first step: clamped to 0 and to 25
    for value in (0.0, 25.0):

        def clamp(h: torch.Tensor, value: float = value) -> torch.Tensor:
            moved = value - encode_one(w, h, feature, architecture)
            return h + moved[..., None] * w["W_dec"][feature]

        doc = trace(
            monkeypatch, capsys, tiny_dir, "--sae", folder, "--sae-clamp", f"sae-{architecture}:{feature}:{value}"
        )
        assert_steps(doc, *reference_steps(tiny_dir, ids, clamp))
        assert doc["steps"][0]["interventions"] == [f"clamp L1 ={value:g} sae-{architecture}#{feature}"]
        # The SAE reads the residual the model ran: the clamped one (its encode of it, not the value itself).
        seen: list[torch.Tensor] = []

        def clamp_seen(h: torch.Tensor, seen: list[torch.Tensor] = seen) -> torch.Tensor:
            seen.append(clamp(h)[0, -1])
            return clamp(h)

        reference_steps(tiny_dir, ids, clamp_seen, steps=1)
        expected = encode_one(w, seen[0], feature, architecture)
        shown = {f["id"]: f["activation"] for f in doc["steps"][0]["sae"][0]["features"]}
        assert shown.get(feature, 0.0) == pytest.approx(float(expected), abs=1e-4)


@pytest.mark.parametrize(
    "more, said",
    [
        (["--sae-steer", "nope:1:4"], "no SAE named 'nope' is loaded (sae-standard)"),
        (["--sae-steer", "sae-standard:64:4"], "sae-standard has features 0-63"),
        (["--sae-steer", "sae-standard:x:4"], "--sae-steer takes SAE:ID:STRENGTH"),
        (["--sae-clamp", "sae-standard:1:inf"], "a feature's value is a number"),
    ],
)
def test_a_mistaken_feature_intervention_is_one_line(monkeypatch, capsys, tiny_dir, saes, more, said):
    args = ["trace", PROMPT, "--model", tiny_dir, "--steps", "1", "--sae", saes["standard"], *more]
    code, _out, err = invoke(monkeypatch, capsys, *args)
    assert code == 2 and "Traceback" not in err, err
    assert said in err.strip().splitlines()[-1] and err.count("error:") == 1, err


def test_a_feature_intervention_without_its_sae_names_the_option(monkeypatch, capsys, tiny_dir):
    code, _out, err = invoke(monkeypatch, capsys, "trace", PROMPT, "--model", tiny_dir, "--sae-steer", "x:1:4")
    assert code == 2 and "no SAE named 'x' is loaded (none: load one with --sae DIR)" in err, err


def test_a_journey_steered_and_clamped_by_features_saves_and_verifies(monkeypatch, capsys, tiny_dir, saes, tmp_path):
    """The file keeps each feature's intervention (its SAE's name, folder and layer); replay --verify runs the
    journey again under them and finds the same tokens and numbers."""
    saved = tmp_path / "features.json"
    edits = ["--sae-steer", "sae-standard:5:20", "--sae-clamp", "sae-topk:3:10"]
    doc = trace(
        monkeypatch, capsys, tiny_dir, "--sae", saes["standard"], "--sae", saes["topk"], *edits, "--save", str(saved)
    )
    (kept,) = json.loads(saved.read_text())["replay"]["intervention_sets"]
    assert [(i["kind"], i["sae"], i["layer"]) for i in kept] == [
        ("sae-steer", "sae-standard", 1),
        ("sae-clamp", "sae-topk", 1),
    ]
    code, out, err = invoke(monkeypatch, capsys, "replay", str(saved), "--verify")
    assert code == 0 and "Traceback" not in err, err + out
    assert len(doc["steps"]) == STEPS


def test_a_journey_whose_feature_names_a_folder_without_its_sae_is_one_line(
    monkeypatch, capsys, tiny_dir, saes, tmp_path
):
    """A file is untrusted: an intervention by a feature whose folder holds no SAE (or another one) is one
    line when the journey is run again, never a traceback."""
    saved = tmp_path / "steered.json"
    trace(
        monkeypatch,
        capsys,
        tiny_dir,
        "--sae",
        saes["standard"],
        "--sae-steer",
        "sae-standard:5:20",
        "--save",
        str(saved),
    )
    for folder, said in ((tmp_path / "empty", "holds no SAE"), (Path(saes["topk"]), "is another now")):
        folder.mkdir(exist_ok=True)
        journey = json.loads(saved.read_text())
        journey["replay"]["intervention_sets"][0][0]["folder"] = str(folder)
        tampered = tmp_path / f"tampered-{folder.name}.json"
        tampered.write_text(json.dumps(journey))
        code, _, err = invoke(monkeypatch, capsys, "replay", str(tampered), "--verify")
        assert code == 2 and said in err and err.count("error:") == 1 and "Traceback" not in err, err
