"""An SAE's features on a GGUF in llama.cpp (`trace --backend llama.cpp --sae DIR`): at every step, SAELens's
own encode (run in its environment: tests/sae_reference.py) of the residual llama.cpp computed there."""

from __future__ import annotations

import json

import numpy as np
import pytest
import sae_reference
from clitools import invoke
from llama_reference import PROMPT, THREADS, engine_on
from sae_folders import saelens_sae

pytestmark = [pytest.mark.llamacpp, pytest.mark.features, pytest.mark.usefixtures("llama_cpp")]
LAYER, HIDDEN = 20, 576  # the bundled SmolLM2-135M's residual after layer 20 of 30


def test_features_on_llama_cpp_are_saelens_encode_of_llama_cpps_residual(sae_libraries, tmp_path, monkeypatch, capsys):
    python = sae_reference.python_of(sae_libraries)
    folder = saelens_sae(tmp_path / "sae", "jumprelu", HIDDEN, 3, layer=LAYER)
    args = ["trace", PROMPT, "--backend", "llama.cpp", "--threads", str(THREADS), "--steps", "4", "--temperature", "0"]
    code, out, err = invoke(monkeypatch, capsys, *args, "--sae", str(folder), "--json")
    assert code == 0, err
    doc = json.loads(out)
    ids = [t["id"] for t in doc["prompt"]] + [s["chosen"]["id"] for s in doc["steps"]]
    positions = [len(doc["prompt"]) - 1 + i for i in range(len(doc["steps"]))]
    engine = engine_on()
    residuals = engine.residual(ids, positions, LAYER).numpy()
    theirs = sae_reference.encode(python, "sae_lens", folder, residuals, tmp_path)
    for i, step in enumerate(doc["steps"]):
        (reading,) = step["sae"]
        active = np.flatnonzero(theirs[i] > 0)
        assert reading["l0"] == len(active) > 0 and reading["layer"] == LAYER
        shown = {f["id"]: f["activation"] for f in reading["features"]}
        assert set(shown) == set(active[np.argsort(-theirs[i, active])][:64].tolist())
        for feature, activation in shown.items():
            assert abs(activation - theirs[i, feature]) <= 1e-4 * abs(theirs[i, feature]) + 1e-5
