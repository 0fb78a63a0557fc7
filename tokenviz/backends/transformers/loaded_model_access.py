"""What the analyses (the lens, attribution, the logit split, beams, speculation, the interventions) reach of
a loaded model: the model itself, where its inputs go, the journey's cache, its description, its end ids and
its tokenizer's texts. The runner is one; the analyses name only this, so no import runs back up to it."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from tokenviz.backends.transformers.step_lens import StepLens
from tokenviz.contract.records import ModelInfo


class ModelAccess(Protocol):
    @property
    def model(self) -> Any:
        """The transformers model (a PreTrainedModel)."""

    @property
    def device(self) -> torch.device:
        """Where the model's inputs go (a device-mapped model's first layer's device)."""

    @property
    def cache(self) -> Any:
        """The journey's KV cache (a DynamicCache of GrowingLayers: see cache.full_cache)."""

    @property
    def info(self) -> ModelInfo: ...

    @property
    def step_lens(self) -> StepLens:
        """The lens's rows the journey's last steps kept (see step_lens)."""

    @property
    def eos_ids(self) -> set[int]:
        """The ids that end generation."""

    def piece(self, token_id: int) -> str:
        """The token's text as the journey shows it."""

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        """The text's ids; with `special_tokens` those the tokenizer adds to a whole text."""
