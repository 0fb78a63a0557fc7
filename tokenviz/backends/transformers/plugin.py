"""The transformers backend as a plugin (contract.backend): the model in this process, in PyTorch, the
default. Its options are where and how the model loads (model_choice.OPTIONS)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenviz.backends.transformers.model_choice import OPTIONS, ModelChoice
from tokenviz.contract.backend import OpenEngine, Opening, Progress
from tokenviz.contract.errors import TokenvizError
from tokenviz.system.ollama import PREFIX as OLLAMA

if TYPE_CHECKING:
    from tokenviz.backends.transformers.runner import ModelRunner


class TransformersBackend:
    name = "transformers"
    about = "the model in this process, in PyTorch through Hugging Face transformers (the default)"
    weights_here, draws = True, False
    options = OPTIONS

    def asked(self, given: frozenset[str]) -> bool:
        return False  # the default: chosen when no other is

    def loader(self, opening: Opening) -> OpenEngine:
        """The model loads in the worker's thread, its config and tokenizer checked first against what the
        journey will ask (its grammar, the interventions in force: see before_weights.journey_checks)."""
        model = ModelChoice.of(opening)  # its placement checked here
        grammar, interventions = opening.settings.grammar, opening.interventions
        if (model.model or "").startswith(OLLAMA):
            raise TokenvizError(
                f"--model {model.model}: the transformers backend takes a Hugging Face id, a directory or a .gguf "
                "path; an Ollama name goes with the --backend that runs Ollama's GGUFs (tokenviz --help)"
            )

        def load(progress: Progress) -> ModelRunner:
            from tokenviz.backends.transformers.before_weights import journey_checks
            from tokenviz.backends.transformers.runner import ModelRunner

            return ModelRunner(model.load(progress, journey_checks(grammar, interventions)))

        return load


BACKEND = TransformersBackend()
