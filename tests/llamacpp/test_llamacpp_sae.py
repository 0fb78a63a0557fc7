"""An SAE's features on a GGUF in llama.cpp (`trace --backend llama.cpp --sae DIR`): at every step, SAELens's
own encode (run in its environment: tests/sae_reference.py) of the residual llama.cpp computed there; and
steering and clamping by a feature, held to llama-cpp-python's own control vector and a callback of the test's;
and the features a quantization moves (compare --sae), each side SAELens's encode of that side's residual."""

from __future__ import annotations

import json

import numpy as np
import pytest
import sae_reference
from clitools import invoke
from llama_reference import PROMPT, engine_on, offloaded_args, trace
from sae_folders import gemma_scope_sae, saelens_sae, sparsify_sae
from test_llamacpp_steering import Context, assert_steps

pytestmark = [pytest.mark.llamacpp, pytest.mark.features, pytest.mark.usefixtures("llama_cpp")]
LAYER, HIDDEN = 20, 576  # the bundled SmolLM2-135M's residual after layer 20 of 30


def test_features_on_llama_cpp_are_each_librarys_encode_of_llama_cpps_residual(
    sae_libraries, tmp_path, monkeypatch, capsys
):
    """The issue's done-when, llama.cpp's part: an SAE in each of the three layouts (SAELens, Gemma Scope 2,
    sparsify), each step's active features its library's own encode of the residual llama.cpp computed."""
    python = sae_reference.python_of(sae_libraries)
    made = [
        (saelens_sae(tmp_path / "sae", "jumprelu", HIDDEN, 3, layer=LAYER), "sae_lens"),
        (gemma_scope_sae(tmp_path / "gemma-scope", HIDDEN, 7, layer=LAYER), "gemma_scope"),
        (sparsify_sae(tmp_path / "sparsify", HIDDEN, 8, layer=LAYER) / f"layers.{LAYER}", "sparsify"),
    ]
    args = ["trace", PROMPT, "--backend", "llama.cpp", *offloaded_args(), "--steps", "4", "--temperature", "0"]
    code, out, err = invoke(monkeypatch, capsys, *args, *(a for f, _ in made for a in ("--sae", str(f))), "--json")
    assert code == 0, err
    doc = json.loads(out)
    ids = [t["id"] for t in doc["prompt"]] + [s["chosen"]["id"] for s in doc["steps"]]
    positions = [len(doc["prompt"]) - 1 + i for i in range(len(doc["steps"]))]
    engine = engine_on()
    residuals = engine.residual(ids, positions, LAYER).numpy()
    for k, (folder, library) in enumerate(made):
        work = tmp_path / f"work-{k}"
        work.mkdir()
        theirs = sae_reference.encode(python, library, folder, residuals, work)
        for i, step in enumerate(doc["steps"]):
            reading = step["sae"][k]
            active = np.flatnonzero(theirs[i] > 0)
            assert reading["l0"] == len(active) > 0 and reading["layer"] == LAYER, library
            shown = {f["id"]: f["activation"] for f in reading["features"]}
            assert set(shown) == set(active[np.argsort(-theirs[i, active])][:64].tolist())
            for feature, activation in shown.items():
                assert abs(activation - theirs[i, feature]) <= 1e-4 * abs(theirs[i, feature]) + 1e-5, library


STEERED_LAYER = 15  # of the bundled model's 30: a control vector there moves the tokens


def test_steering_by_a_feature_is_llama_cpps_own_control_vector(monkeypatch, capsys, reference, tmp_path):
    """The issue's done-when: --sae-steer on llama.cpp equals the same control vector (the feature's decoder
    row times the strength, after the SAE's layer) applied through llama-cpp-python, bit for bit."""
    import llama_cpp.llama_cpp as lib
    from safetensors.numpy import load_file

    folder = saelens_sae(tmp_path / "sae", "jumprelu", HIDDEN, 3, layer=STEERED_LAYER)
    row = load_file(str(folder / "sae_weights.safetensors"))["W_dec"][7]
    control = np.zeros((lib.llama_model_n_layer(reference.model) - 1, HIDDEN), dtype=np.float32)
    control[STEERED_LAYER - 1] = np.float32(60.0) * row
    steered = Context(reference, STEERED_LAYER, control)
    prompt = reference.tokenize(PROMPT.encode(), add_bos=True, special=True)
    try:
        expected = steered.greedy(prompt, 4)
    finally:
        steered.close()
    doc = trace(
        monkeypatch, capsys, "--steps", "4", "--temperature", "0", "--sae", str(folder), "--sae-steer", "sae:7:60"
    )
    assert_steps(doc, *expected)
    plain = trace(monkeypatch, capsys, "--steps", "1", "--temperature", "0")
    assert doc["steps"][0]["top"][0]["logit"] != plain["steps"][0]["top"][0]["logit"]  # (the steering shows)
    assert doc["steps"][0]["unsteered"]["top"][0]["id"] == plain["steps"][0]["top"][0]["id"]


def test_clamping_a_feature_on_llama_cpp_is_the_residual_llama_cpp_computed_moved(
    monkeypatch, capsys, reference, tmp_path
):
    """--sae-clamp moves each row of llama.cpp's residual after the SAE's layer by (value - the feature's
    activation) times its decoder row, in the step's own pass: the tokens and logits of the test's own
    callback doing the same with the SAE's JumpReLU written out here, bit for bit up to float32's sums."""
    from safetensors.numpy import load_file

    folder = saelens_sae(tmp_path / "sae", "jumprelu", HIDDEN, 3, layer=LAYER)
    w = load_file(str(folder / "sae_weights.safetensors"))
    feature, value = 2, 30.0

    def clamp(rows: np.ndarray) -> np.ndarray:
        pre = (rows - w["b_dec"]) @ w["W_enc"][:, feature] + w["b_enc"][feature]
        active = np.where(pre > w["threshold"][feature], np.maximum(pre, 0), 0).astype(np.float32)
        return rows + (np.float32(value) - active)[:, None] * w["W_dec"][feature]

    clamped = Context(reference, LAYER)
    clamped.change = clamp
    prompt = reference.tokenize(PROMPT.encode(), add_bos=True, special=True)
    try:
        tokens, logits = clamped.greedy(prompt, 4)
    finally:
        clamped.close()
    doc = trace(
        monkeypatch,
        capsys,
        "--steps",
        "4",
        "--temperature",
        "0",
        "--sae",
        str(folder),
        "--sae-clamp",
        f"sae:{feature}:{value}",
    )
    assert [s["chosen"]["id"] for s in doc["steps"]] == tokens
    for step, row in zip(doc["steps"], logits):  # the encode's float32 sums are torch's here, numpy's there
        shown = step["top"][:20]
        assert [e["logit"] for e in shown] == pytest.approx(row[[e["id"] for e in shown]].tolist(), abs=1e-4)
    plain = trace(monkeypatch, capsys, "--steps", "1", "--temperature", "0")
    assert doc["steps"][0]["top"][0]["logit"] != pytest.approx(plain["steps"][0]["top"][0]["logit"], abs=1e-3)


def test_compare_names_the_features_llama_cpps_quantization_moves(sae_libraries, tmp_path, monkeypatch, capsys):
    """compare --backend llama.cpp --against-backend transformers --sae DIR: the bundled Q4_1 GGUF as llama.cpp
    runs it (A) against the same file dequantized to float32 in transformers (B). Each step names the features
    whose activations differ most, each side's activation SAELens's own encode of that side's residual on A's
    tokens (llama.cpp's, transformers' own pass), the most moved first."""
    import torch
    from transformers import AutoModelForCausalLM

    from tokenviz.system.paths import bundled_gguf

    python = sae_reference.python_of(sae_libraries)
    folder = saelens_sae(tmp_path / "sae", "jumprelu", HIDDEN, 3, layer=LAYER)
    args = ["compare", PROMPT, "--backend", "llama.cpp", *offloaded_args(), "--against-backend", "transformers"]
    code, out, err = invoke(
        monkeypatch, capsys, *args, "--steps", "3", "--temperature", "0", "--sae", str(folder), "--json"
    )
    assert code == 0, err
    doc = json.loads(out)
    steps = doc["a"]["steps"]
    ids = [t["id"] for t in doc["a"]["prompt"]] + [s["chosen"]["id"] for s in steps]
    positions = [len(doc["a"]["prompt"]) - 1 + i for i in range(len(steps))]
    ours = engine_on().residual(ids, positions, LAYER).numpy()
    gguf = bundled_gguf()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    with torch.no_grad():
        theirs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[LAYER + 1][0, positions].numpy()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    in_a = sae_reference.encode(python, "sae_lens", folder, ours, tmp_path / "a")
    in_b = sae_reference.encode(python, "sae_lens", folder, theirs, tmp_path / "b")
    assert len(doc["sae_moves"]) == len(steps)
    for i, (moves,) in enumerate(doc["sae_moves"]):
        assert (moves["sae"], moves["layer"], moves["position"]) == ("sae", LAYER, positions[i])
        assert moves["a_l0"] == int((in_a[i] > 0).sum()) and moves["b_l0"] == int((in_b[i] > 0).sum())
        apart = np.abs(in_a[i] - in_b[i])
        assert moves["features"] and moves["features"][0]["id"] in np.argsort(-apart)[:2].tolist()
        for f in moves["features"]:
            assert f["a"] == pytest.approx(float(in_a[i, f["id"]]), rel=1e-4, abs=1e-4)
            assert f["b"] == pytest.approx(float(in_b[i, f["id"]]), rel=1e-3, abs=1e-3)
