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
    assert live_command(dataclasses.replace(info, name=BUNDLED_NAME)) == "tokenviz"
    llama = dataclasses.replace(info, name=BUNDLED_NAME, runtime="llama.cpp (llama-cpp-python 0.3.36)")
    assert live_command(llama) == "tokenviz --backend llama.cpp"
    spaced = dataclasses.replace(info, name="my models/a b.gguf")
    assert shlex.split(live_command(spaced)) == ["tokenviz", "--model", "my models/a b.gguf"]
    served = dataclasses.replace(info, remote="127.0.0.1:8000")
    assert live_command(served).startswith("tokenviz --endpoint URL (the server at 127.0.0.1:8000)")
