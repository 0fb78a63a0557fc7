"""An SAE's features on a served model (`trace --endpoint URL --tokenizer DIR --sae DIR`): the residual the
vllm-lens plugin returns is transformers' own at each step's position, and every active feature is SAELens's
own encode of it (run in its environment: tests/sae_reference.py); steering and clamping by a feature are
transformers' own model changed the same way."""

from __future__ import annotations

import json

import numpy as np
import pytest
import sae_reference
from clitools import invoke
from sae_folders import gemma_scope_sae, saelens_sae, sparsify_sae
from test_served_internals import served
from test_served_steering import assert_steps_match, layer_hook, reference, steered_greedy, trace_json

pytestmark = [pytest.mark.served, pytest.mark.features]
__all__ = ["reference"]  # the served model in transformers (a fixture)
PROMPT = "The Eiffel Tower is located in"
KEY_ENV = "TOKENVIZ_TEST_SERVER_KEY"
LAYER, HIDDEN = 20, 576
RESIDUAL_TOLERANCE = 1e-3  # relative: vLLM's float32 kernels against transformers' (the lens test's bound)


def test_features_on_a_served_model_are_saelens_encode_of_the_servers_residual(
    monkeypatch, capsys, tmp_path, vllm_lens_server, sae_libraries
):
    import torch
    from transformers import AutoModelForCausalLM

    from tokenviz.backends.served.completions import ServedChoice
    from tokenviz.backends.served.engine import ServedEngine
    from tokenviz.backends.shared.endpoint import ApiKey

    python = sae_reference.python_of(sae_libraries)
    folder = saelens_sae(tmp_path / "sae", "topk", HIDDEN, 5, layer=LAYER)
    made = [
        (folder, "sae_lens"),
        (gemma_scope_sae(tmp_path / "gemma-scope", HIDDEN, 7, layer=LAYER), "gemma_scope"),
        (sparsify_sae(tmp_path / "sparsify", HIDDEN, 8, layer=LAYER) / f"layers.{LAYER}", "sparsify"),
    ]  # each of the three layouts: the done-when
    monkeypatch.setenv(KEY_ENV, vllm_lens_server.key)
    directory = str(vllm_lens_server.model)
    args = ["--endpoint", vllm_lens_server.url, "--api-key-env", KEY_ENV, "--tokenizer", directory]
    saved = tmp_path / "journey.json"
    saes = [a for f, _ in made for a in ("--sae", str(f))]
    options = ["--steps", "4", "--temperature", "0", *saes, "--save", str(saved), "--json"]
    code, out, err = invoke(monkeypatch, capsys, "trace", PROMPT, *args, *options)
    assert code == 0, err
    doc = json.loads(out)
    ids = [t["id"] for t in doc["prompt"]] + [s["chosen"]["id"] for s in doc["steps"]]
    positions = [len(doc["prompt"]) - 1 + i for i in range(len(doc["steps"]))]
    choice = ServedChoice(vllm_lens_server.url, api_key=ApiKey(env=KEY_ENV))
    engine = ServedEngine.open(choice, directory)
    served = engine.residual(ids, positions, LAYER).numpy()
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        own = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[LAYER + 1][0, positions].numpy()
    assert np.abs(served - own).max() <= RESIDUAL_TOLERANCE * np.abs(own).max()
    for k, (sae, library) in enumerate(made):
        work = tmp_path / f"work-{k}"
        work.mkdir()
        theirs = sae_reference.encode(python, library, sae, served, work)
        for i, step in enumerate(doc["steps"]):
            reading = step["sae"][k]
            active = np.flatnonzero(theirs[i] > 0)
            assert reading["l0"] == len(active) > 0, library
            for feature in reading["features"]:
                expected = theirs[i, feature["id"]]
                assert expected > 0 and abs(feature["activation"] - expected) <= 1e-4 * expected + 1e-5, library
    # the file keeps the readings and where the SAE is: replay --verify reads them again and holds them to it
    code, out, err = invoke(monkeypatch, capsys, "replay", str(saved), "--verify", *args)
    assert code == 0 and "verified: all 4 steps" in out, err
    tampered = json.loads(saved.read_text())
    tampered["step_views"][1]["sae"][0]["features"][0]["activation"] += 0.5
    saved.write_text(json.dumps(tampered))
    code, out, err = invoke(monkeypatch, capsys, "replay", str(saved), "--verify", *args)
    assert code == 1 and "mismatch: step_views[1].sae[0].features[0].activation" in err, err


def test_steering_and_clamping_a_feature_on_a_served_model_are_transformers_own(
    monkeypatch, capsys, tmp_path, vllm_lens_server, reference
):
    """--sae-steer sends the feature's decoder row times the strength as a steering vector; --sae-clamp sends,
    at every position, the clamped residual minus the journey's (read from the server first): both give the
    tokens and probabilities of the same change made by a hook in transformers' own model."""
    import torch
    from safetensors.torch import load_file

    model, tokenizer = reference
    folder = saelens_sae(tmp_path / "sae", "standard", HIDDEN, 4, layer=LAYER)
    w = load_file(str(folder / "sae_weights.safetensors"))
    args = served(vllm_lens_server, monkeypatch, "--tokenizer", str(vllm_lens_server.model))
    options = ["--steps", "3", "--temperature", "0", "--sae", str(folder), "--json"]
    ids = tokenizer(PROMPT)["input_ids"]
    doc = trace_json(monkeypatch, capsys, PROMPT, *args, *options, "--sae-steer", "sae:9:60")
    row = w["W_dec"][9]
    assert_steps_match(doc, *steered_greedy(model, ids, 3, layer_hook(model, LAYER, lambda h: h + 60.0 * row)))

    def clamp(hidden):
        active = torch.relu((hidden - w["b_dec"]) @ w["W_enc"][:, 9] + w["b_enc"][9])
        return hidden + (40.0 - active)[..., None] * row

    doc = trace_json(monkeypatch, capsys, PROMPT, *args, *options, "--sae-clamp", "sae:9:40")
    assert_steps_match(doc, *steered_greedy(model, ids, 3, layer_hook(model, LAYER, clamp)))
