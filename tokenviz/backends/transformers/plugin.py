"""The transformers backend as a plugin (contract.backend): the model in this process, in PyTorch, the
default. Its options are the model options every command shares (tokenviz.cli.options.MODEL_OPTIONS)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenviz.contract.backend import BackendOption, OpenEngine, Opening, Progress
from tokenviz.contract.errors import TokenvizError
from tokenviz.system.ollama import PREFIX as OLLAMA

if TYPE_CHECKING:
    from tokenviz.backends.transformers.runner import ModelRunner


class TransformersBackend:
    name = "transformers"
    about = "the model in this process, in PyTorch through Hugging Face transformers (the default)"
    local = True
    options: tuple[BackendOption, ...] = ()

    def asked(self, given: frozenset[str]) -> bool:
        return False  # (the default: chosen when no other is)

    def loader(self, opening: Opening) -> OpenEngine:
        """The model loads in the worker's thread, its config and tokenizer checked first against what the
        journey will ask (its grammar, the interventions in force: see before_weights.journey_checks)."""
        model, grammar, interventions = opening.model, opening.settings.grammar, opening.interventions
        if (model.model or "").startswith(OLLAMA):
            raise TokenvizError(f"--model {model.model}: Ollama's models run in llama.cpp: add --backend llama.cpp")

        def load(progress: Progress) -> ModelRunner:
            from tokenviz.backends.transformers.before_weights import journey_checks
            from tokenviz.backends.transformers.runner import ModelRunner

            return ModelRunner(model.load(progress, journey_checks(grammar, interventions)))

        return load


BACKEND = TransformersBackend()
