"""Whether a model's output layer, run again over the hidden states it reads, gives the model's own logits.

When it does, a prefill keeps the hidden states of every position and makes their predictions when they
are asked for (deferred), instead of every position's logits. It is checked once per model, on the last
position of its first prefill (one read of the device); a family whose output does more than tokenviz's
head knows keeps every position's logits instead: slower, never wrong."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from tokenviz.backends.shared.output_head import head_logits

HEAD_TOLERANCE = 1e-4  # the output layer run again on the last position gives the model's logits within this
_CHECKED: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()  # by model


def head_reproduces(model: Any) -> bool | None:
    """What the check found for `model`; None until it has run."""
    return _CHECKED.get(model)


def settle_head(model: Any, reproduces: bool) -> None:
    """Take `reproduces` as the check's answer for `model` (a test plays a family whose head does more)."""
    _CHECKED[model] = reproduces


def output_layer(model: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The model's logits from what its output layer reads (see hf.output_head.head_logits)."""

    def logits(hidden: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return head_logits(model, hidden)

    return logits


def check_head(model: Any, hidden: torch.Tensor, logits: torch.Tensor) -> bool:
    """Whether the output layer run on `hidden` gives `logits`, the model's own."""
    again = output_layer(model)(hidden).float()
    scale = max(float(logits.float().abs().max()), 1.0)
    return bool(again.shape == logits.shape and (again - logits.float()).abs().max() <= HEAD_TOLERANCE * scale)
