"""Interventions by a sparse autoencoder's feature (contract.interventions.FeatureSteering, FeatureClamp):
each found among the SAEs loaded when it is set (its layer and folder filled in), and what every backend
does with it: a steering adds the feature's decoder row times its strength, a vector like any steering's;
a clamp moves each position's residual by (value - the feature's activation there) times that row, which
the backend computes where the residual is (a hook in transformers, llama.cpp's evaluation callback)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from pathlib import Path

import torch

from tokenviz.contract.errors import SettingsError
from tokenviz.contract.interventions import UNRESOLVED, FeatureClamp, FeatureIntervention, FeatureSteering, Intervention
from tokenviz.contract.text import safe_text
from tokenviz.features.sae_folder import read_saes
from tokenviz.features.sparse_autoencoder import SparseAutoencoder, sae_named

_READ: dict[tuple[str, str, int], SparseAutoencoder] = {}  # (folder, name, mtime in ns): one SAE read once
_READING = threading.Lock()


def with_sae(intervention: Intervention, saes: Sequence[SparseAutoencoder]) -> Intervention:
    """A feature's intervention with its SAE's layer and folder (the first SAE loaded of its name), its
    feature checked against that SAE's width; any other intervention, or one already filled, as it is."""
    if not isinstance(intervention, FeatureSteering | FeatureClamp) or intervention.layer != UNRESOLVED:
        return intervention
    try:
        sae = sae_named(saes, intervention.sae, intervention.feature)
    except SettingsError as exc:
        raise SettingsError(f"{intervention.label}: {exc}") from None
    return dataclasses.replace(intervention, layer=sae.layer, folder=sae.folder)


def sae_of(intervention: FeatureIntervention) -> SparseAutoencoder:
    """The SAE the intervention names, read from its folder (once while the folder is unchanged)."""
    path = Path(intervention.folder)
    if not intervention.folder or intervention.layer == UNRESOLVED:
        raise SettingsError(f"{intervention.label}: its SAE was not found among those loaded")
    try:
        key = (str(path), intervention.sae, path.stat().st_mtime_ns)
    except OSError:
        raise SettingsError(f"{intervention.label}: its SAE's folder {safe_text(str(path))} is gone") from None
    with _READING:
        if key not in _READ:
            sae = next((s for s in read_saes(path) if s.name == intervention.sae), None)  # (a file may name any)
            if sae is None or sae.layer != intervention.layer or intervention.feature >= sae.d_sae:
                raise SettingsError(f"{intervention.label}: the SAE in {safe_text(str(path))} is another now")
            _READ.clear()  # one held at a time: an SAE may be gigabytes
            _READ[key] = sae
        return _READ[key]


def feature_vector(steering: FeatureSteering) -> torch.Tensor:
    """The feature's direction as its SAE's decode writes it (d_in,), float32, before the strength."""
    return sae_of(steering).decoder_rows([steering.feature])[0].to(torch.float32)


class Clamp:
    """What a clamp does to residuals: each row moved so the feature's activation is the clamp's value,
    the rest of the residual (the SAE's reconstruction of the other features and its error) kept."""

    def __init__(self, clamp: FeatureClamp):
        self.feature, self.value = clamp.feature, clamp.value
        self._sae = sae_of(clamp)
        self._on: dict[torch.device, tuple[SparseAutoencoder, torch.Tensor]] = {}  # the SAE where residuals are

    def _sae_on(self, device: torch.device) -> tuple[SparseAutoencoder, torch.Tensor]:
        if device not in self._on:
            on = self._sae.to(device)
            self._on[device] = (on, on.decoder_rows([self.feature])[0].to(torch.float32))
        return self._on[device]

    def __call__(self, residuals: torch.Tensor) -> torch.Tensor:
        """`residuals` (..., d_in) clamped, in their own dtype and device."""
        flat = residuals.reshape(-1, residuals.shape[-1]).to(torch.float32)
        sae, row = self._sae_on(flat.device)
        moved = self.value - sae.encode(flat)[:, self.feature]
        return (flat + moved[:, None] * row).reshape(residuals.shape).to(residuals.dtype)
