"""`trace --attention LAYER` on a model run here: each step's attention row at that layer is
transformers' own eager attention of the same tokens; a layer the model lacks is one line."""

from __future__ import annotations

import json

import pytest
import torch
from clitools import invoke
from tiny import save_tiny

PROMPT = "The cat sat on the"
TOLERANCE = 1e-5  # a weight: the app's attention rows against transformers' eager attention, float32 both


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-attention"), "llama", context=64)


def test_each_steps_attention_row_is_transformers_eager_attention(monkeypatch, capsys, tiny_dir):
    from transformers import AutoModelForCausalLM

    args = ["--model", tiny_dir, "--steps", "4", "--temperature", "0", "--dtype", "float32", "--device", "cpu"]
    code, out, err = invoke(monkeypatch, capsys, "trace", PROMPT, *args, "--attention", "1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    prompt = [t["id"] for t in doc["prompt"]]
    ids = prompt + [s["chosen"]["id"] for s in doc["steps"]]
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        attentions = model(torch.tensor([ids[:-1]]), output_attentions=True).attentions[1][0]
    for i, step in enumerate(doc["steps"]):
        position = len(prompt) - 1 + i
        mine = torch.tensor(step["attention"]["heads"])
        theirs = attentions[:, position, : position + 1]
        assert step["attention"]["layer"] == 1 and mine.shape == theirs.shape
        assert (mine - theirs).abs().max() < TOLERANCE


def test_a_layer_the_model_lacks_is_one_line(monkeypatch, capsys, tiny_dir):
    code, _, err = invoke(monkeypatch, capsys, "trace", PROMPT, "--model", tiny_dir, "--attention", "99")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "--attention 99" in errors[0] and "layers are 0 to" in errors[0]
