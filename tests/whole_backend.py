"""The tests' own backend with every capability (a cache, attention rows, the lens, attribution,
interventions, the logit split, routing, a tokenizer and grammars): the transformers backend's engine on
a tiny model's fixed weights (tests/tiny.py, seed 0), said as a runtime of its own. Nothing outside
backends/ may tell it from the transformers backend by which it is: it gets every view by what it says."""

from __future__ import annotations

import dataclasses

from fixed_backend import FixedBackend
from tiny import tiny_model

from tokenviz.backends.transformers.loading import LoadedModel
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.backend import Opening

RUNTIME = "the whole runtime (the tests' own: every capability, on fixed weights)"


class WholeEngine(ModelRunner):
    def __init__(self, loaded: LoadedModel):
        super().__init__(loaded)
        self.info = dataclasses.replace(self.info, name="whole", runtime=RUNTIME, details=(("weights", "fixed"),))

    def twin(self) -> WholeEngine:
        return WholeEngine(self.loaded)


class WholeBackend(FixedBackend):
    name, about = "whole", "every capability on a tiny model's fixed weights (the tests' own)"

    def loader(self, opening: Opening):
        return lambda progress: WholeEngine(tiny_model("llama"))


BACKEND = WholeBackend()
