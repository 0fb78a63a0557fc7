"""A sparse autoencoder's reading of the residual stream at one position: which of its features are active
and how much, what share of the residual each explains, how many are on and what it leaves unexplained.
Plain data: tokenviz.features computes it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FeatureActivation:
    id: int  # the feature: its row of the SAE's decoder
    activation: float  # as the SAE's own encode gives it
    share: float  # of the residual's squared norm, its decoder row × activation projected on the residual


@dataclass(frozen=True)
class FeatureReading:
    """One SAE at one position: its active features, strongest first (at most `shown` of `l0`)."""

    sae: str  # the SAE's name (its folder's)
    layer: int  # the residual after this decoder layer
    position: int
    features: tuple[FeatureActivation, ...]
    l0: int  # how many features are active
    error: float  # the reconstruction's error: |residual - decoded| / |residual|


@dataclass(frozen=True)
class FeatureReadings:
    """Every SAE loaded, read at one position of the journey (the features view's answer)."""

    position: int
    readings: tuple[FeatureReading, ...]  # in the order the SAEs were given
    ids: tuple[int, ...]  # the journey's tokens up to the position, as read (another path reads again)
