"""The transformers backend's loader, called in a worker's thread: the model loaded (and its decode step
compiled where asked), then run by a ModelRunner."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokenviz.contract.backend import Progress
from tokenviz.contract.placement import DEFAULT_PLACEMENT, Placement

if TYPE_CHECKING:
    from tokenviz.backends.transformers.loading import LoadedModel

ModelLoader = Callable[[Progress], "LoadedModel"]
BeforeWeights = Callable[[Any, Any], None]  # (config, tokenizer): see tokenviz.backends.transformers.loading.load_model


def model_loader(
    model: str | None,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    placement: Placement = DEFAULT_PLACEMENT,
    compile: bool = False,
    before_weights: BeforeWeights | None = None,
) -> ModelLoader:
    """A loader for `model` (None: the bundled one), its decode step compiled with `compile`;
    `before_weights` checks the config and tokenizer before the weights load (see load_model)."""

    def load(progress: Progress) -> LoadedModel:
        # Deferred: torch and transformers are imported in the engine thread, after the first frame.
        from tokenviz.backends.transformers.loading import load_model

        loaded = load_model(model, device, dtype, trust_remote_code, progress, placement, before_weights)
        if not compile:
            return loaded
        from tokenviz.backends.transformers.compiled_step import compiled

        return compiled(loaded, progress)

    return load
