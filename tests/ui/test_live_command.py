"""A recording's hint runs as written (issue 69, finding 18): it said "tokenviz --model SmolLM2-135M-
Instruct (bundled, Q4_1 GGUF)", a description, not a model a command takes."""

import dataclasses
import shlex

from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.system.paths import BUNDLED_NAME
from tokenviz.ui.panes.base import live_command


def test_the_hint_names_the_model_as_a_command_takes_it():
    info = ModelRunner(tiny_model("llama")).info
    assert live_command(dataclasses.replace(info, name=BUNDLED_NAME, reopen="")) == "tokenviz"
    assert info.reopen == "tokenviz --model tiny-llama"  # (as its backend wrote it)
    said = dataclasses.replace(info, reopen="tokenviz --backend other --model x.gguf")
    assert live_command(said) == "tokenviz --backend other --model x.gguf"  # (what a backend writes, whole)
    before = dataclasses.replace(info, name="my models/a b.gguf", reopen="")  # (a file saved before backends wrote it)
    assert shlex.split(live_command(before)) == ["tokenviz", "--model", "my models/a b.gguf"]
