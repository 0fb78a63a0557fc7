"""The watched features' activations a session keeps between steps (journey.feature_readings.follow_features
fills and reads them): by position, for the tokens and interventions they were read under, so a rewind, a
branch or another intervention reads again from where the journey differs, and nothing else is read twice."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Followed:
    ids: tuple[int, ...] = ()
    interventions: tuple[object, ...] = ()
    values: dict[tuple[str, int], dict[int, float]] = field(default_factory=dict)  # (SAE, feature): by position
