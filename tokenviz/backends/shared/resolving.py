"""What every backend does to the interventions before its passes run them: each checked against the model,
a patch's source as ids checked against the patch's position, a steering's direction scaled (refused where
float32 cannot hold it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tokenviz.contract.errors import SettingsError
from tokenviz.contract.interventions import (
    FeatureSteering,
    Intervention,
    Patch,
    Steering,
    check_against,
    check_patch_source,
)
from tokenviz.contract.records import ModelInfo


def checked(interventions: Sequence[Intervention], info: ModelInfo) -> tuple[Intervention, ...]:
    """`interventions`, each inside the model `info` describes (its layers, its heads): else one line."""
    kept = tuple(interventions)
    check_against(kept, info.layers, info.heads)
    return kept


def patch_source_ids(patch: Patch, encode: Callable[[str], list[int]]) -> list[int]:
    """The ids the patch's residual is read from: its branch's, or its source text's as a prompt has them."""
    ids = list(patch.source_ids) or encode(patch.source)
    check_patch_source(patch, len(ids))
    return ids


def scaled_vector(steering: Steering | FeatureSteering, direction: np.ndarray) -> np.ndarray:
    """The vector the steering adds: its direction times its scale, in float32 (never an infinity added to
    the residual)."""
    vector = np.float32(steering.scale) * np.asarray(direction, dtype=np.float32)
    if not np.isfinite(vector).all():
        raise SettingsError(f"{steering.label}: its vector is not finite in float32; use a smaller scale")
    return vector
