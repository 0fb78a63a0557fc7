"""A sparse autoencoder's features at every step (`trace --sae DIR`), held to the library that made it: SAELens'
own encode (standard, JumpReLU, TopK, gated; and Gemma Scope 2's params as SAELens's loader maps them) and
sparsify's, run in their own environment (tests/sae_reference.py) on the residual transformers itself
computes at each step's position; and hostile SAE folders, each one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import sae_reference
import torch
from clitools import invoke
from sae_folders import FEATURES, gemma_scope_sae, saelens_sae, sparsify_sae, weights
from safetensors.torch import save_file
from tiny import save_tiny

pytestmark = pytest.mark.features

LAYER = 1
PROMPT = "The Eiffel Tower is located in"
# Both sides read the same model's residual at one position: tokenviz's from a pass of the tokens up to it,
# the test's from transformers' pass of the whole journey (float32 sums in another order: 1e-6 apart); an
# activation is compared within 1e-4 of its size (and 1e-5 absolute, for one near 0).
RELATIVE, ABSOLUTE = 1e-4, 1e-5


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return save_tiny(tmp_path_factory.mktemp("tiny-sae"), "llama", context=64)


def hidden_of(model: str) -> int:
    return int(json.loads((Path(model) / "config.json").read_text())["hidden_size"])


def transformers_residuals(model: str, ids: list[int], positions: list[int]) -> np.ndarray:
    """The residual after LAYER at `positions`, from transformers' own pass of the whole journey."""
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    with torch.no_grad():
        states = loaded(torch.tensor([ids]), output_hidden_states=True).hidden_states
    return states[LAYER + 1][0, positions].numpy()  # [0] is the embeddings: [L + 1] the output of layer L


def test_the_sae_libraries_environment_builds(sae_libraries):
    assert sae_libraries.failure is None, sae_libraries.failure


def test_each_layouts_features_at_every_step_are_the_librarys_own_encode(
    sae_libraries, tiny_dir, tmp_path, monkeypatch, capsys
):
    python = sae_reference.python_of(sae_libraries)
    hidden = hidden_of(tiny_dir)
    made = [
        *((saelens_sae(tmp_path / f"saelens-{a}", a, hidden, i), "sae_lens") for i, a in
          enumerate(("standard", "jumprelu", "topk", "gated"))),
        (gemma_scope_sae(tmp_path / "gemma-scope", hidden, 7), "gemma_scope"),
        (sparsify_sae(tmp_path / "sparsify", hidden, 8), "sparsify"),
    ]  # fmt: skip
    args = ["trace", PROMPT, "--model", tiny_dir, "--steps", "6", "--temperature", "0", "--json"]
    code, out, err = invoke(monkeypatch, capsys, *args, *(a for folder, _ in made for a in ("--sae", str(folder))))
    assert code == 0, err
    doc = json.loads(out)
    ids = [t["id"] for t in doc["prompt"]] + [s["chosen"]["id"] for s in doc["steps"]]
    positions = [len(doc["prompt"]) - 1 + i for i in range(len(doc["steps"]))]
    residuals = transformers_residuals(tiny_dir, ids, positions)
    for k, (folder, library) in enumerate(made):
        work = tmp_path / f"work-{k}"
        work.mkdir()
        sae_folder = folder / f"layers.{LAYER}" if library == "sparsify" else folder
        theirs = sae_reference.encode(python, library, sae_folder, residuals, work)
        for i, step in enumerate(doc["steps"]):
            reading = step["sae"][k]
            assert (reading["sae"], reading["layer"], reading["position"]) == (sae_folder.name, LAYER, positions[i])
            active = np.flatnonzero(theirs[i] > 0)
            assert reading["l0"] == len(active), (library, folder.name, i)
            assert sorted(f["id"] for f in reading["features"]) == sorted(active.tolist())
            for feature in reading["features"]:
                expected = float(theirs[i, feature["id"]])
                assert abs(feature["activation"] - expected) <= RELATIVE * abs(expected) + ABSOLUTE, (library, i)
            assert 0 < reading["error"] < 10 and 0 < len(reading["features"]) <= FEATURES


@pytest.mark.parametrize(
    "damage, said",
    [
        ("fifo", "is not a regular file"),
        ("huge", "where its shape needs 128,000,000,000"),
        ("nan", "holds values that are not finite numbers"),
        ("wide", "64 wide; "),
        ("layer", "layers are 0-"),
        ("hook", "names no hook_name"),
        ("attention hook", "tokenviz reads the residual after a layer"),
        ("empty", "holds no SAE"),
    ],
)
def test_a_hostile_sae_folder_is_one_line_and_exit_2(tmp_path, tiny_dir, monkeypatch, capsys, damage, said):
    hidden = hidden_of(tiny_dir)
    folder = saelens_sae(tmp_path / "sae", "standard", hidden, 0)
    weights_file, config_file = folder / "sae_weights.safetensors", folder / "cfg.json"
    config = json.loads(config_file.read_text())
    if damage == "fifo":
        weights_file.unlink()
        os.mkfifo(weights_file)
    elif damage == "huge":  # a header that says 10^9 features (the file holds none of them)
        header = json.dumps({"W_enc": {"dtype": "F32", "shape": [hidden, 10**9], "data_offsets": [0, 0]}}).encode()
        weights_file.write_bytes(len(header).to_bytes(8, "little") + header)
    elif damage == "nan":
        w = weights(hidden, 0)
        save_file({n: w[n] for n in ("W_enc", "b_enc", "W_dec")} | {"b_dec": torch.full((hidden,), float("nan"))},
                  str(weights_file))  # fmt: skip
    elif damage == "wide":
        folder = saelens_sae(tmp_path / "wide", "standard", hidden * 2, 0)
    elif damage == "layer":
        config_file.write_text(json.dumps(config | {"metadata": {"hook_name": "blocks.9.hook_resid_post"}}))
    elif damage == "hook":
        config_file.write_text(json.dumps(config | {"metadata": {}}))
    elif damage == "attention hook":
        config_file.write_text(json.dumps(config | {"metadata": {"hook_name": "blocks.1.attn.hook_z"}}))
    elif damage == "empty":
        folder = tmp_path / "empty"
        folder.mkdir()
    args = ("trace", "Hi", "--model", tiny_dir, "--steps", "1", "--sae", str(folder))
    code, _, err = invoke(monkeypatch, capsys, *args)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and said in errors[0] and "Traceback" not in err, err
