"""The direction a steering adds before its scale, as every backend computes it (so one model steered in
transformers, llama.cpp or on a server moves the same way): of two tokens, the difference of their rows of
the output head; of two texts, the difference of their residuals after the steering's layer at each one's
last token, each text read alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

from tokenviz.contract.interventions import Steering

Vector = TypeVar("Vector", np.ndarray, torch.Tensor)


def steering_direction(
    steering: Steering, head_rows: Callable[[str, str], tuple[Vector, Vector]], residual: Callable[[str], Vector]
) -> Vector:
    """`head_rows(toward, away)`: the two tokens' output rows (a token is its text or id:N); `residual(text)`:
    the residual after the steering's layer at the text's last token."""
    if steering.by == "tokens":
        toward, away = head_rows(steering.toward, steering.away)
    else:
        toward, away = residual(steering.toward), residual(steering.away)
    difference: Vector = toward - away
    return difference
