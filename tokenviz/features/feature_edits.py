"""Interventions by a sparse autoencoder's feature (contract.interventions.FeatureSteering, FeatureClamp):
each found among the SAEs loaded when it is set (its layer and folder filled in), and what every backend
does with it: a steering adds the feature's decoder row times its strength, a vector like any steering's;
a clamp moves each position's residual by (value - the feature's activation there) times that row, which
the backend computes where the residual is (a hook in transformers, llama.cpp's evaluation callback)."""

from __future__ import annotations

import contextlib
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

_KNOWN: dict[tuple[str, str, int], SparseAutoencoder] = {}  # (folder, name, mtime in ns): the newest first out
KNOWN = 4  # SAEs kept by their folder (those a session loaded are held by it anyway: the same objects)
_KNOWING = threading.Lock()


def _key(folder: Path, name: str) -> tuple[str, str, int]:
    return (str(folder), name, folder.stat().st_mtime_ns)


def _know(key: tuple[str, str, int], sae: SparseAutoencoder) -> None:
    with _KNOWING:
        _KNOWN.pop(key, None)
        _KNOWN[key] = sae
        while len(_KNOWN) > KNOWN:
            del _KNOWN[next(iter(_KNOWN))]


def with_sae(intervention: Intervention, saes: Sequence[SparseAutoencoder]) -> Intervention:
    """A feature's intervention with its SAE's layer and folder (the first SAE loaded of its name), its
    feature checked against that SAE's width; any other intervention, or one already filled, as it is. The
    SAE is known by its folder from then on: sae_of does not read it again."""
    if not isinstance(intervention, FeatureSteering | FeatureClamp) or intervention.layer != UNRESOLVED:
        return intervention
    try:
        sae = sae_named(saes, intervention.sae, intervention.feature)
    except SettingsError as exc:
        raise SettingsError(f"{intervention.label}: {exc}") from None
    if sae.folder:
        with contextlib.suppress(OSError):  # (a folder gone meanwhile: sae_of says so)
            _know(_key(Path(sae.folder), sae.name), sae)
    return dataclasses.replace(intervention, layer=sae.layer, folder=sae.folder)


def sae_of(intervention: FeatureIntervention) -> SparseAutoencoder:
    """The SAE the intervention names: one loaded (with_sae), or read from its folder (a journey file's),
    once while the folder is unchanged."""
    path = Path(intervention.folder)
    if not intervention.folder or intervention.layer == UNRESOLVED:
        raise SettingsError(f"{intervention.label}: its SAE was not found among those loaded")
    try:
        key = _key(path, intervention.sae)
    except OSError:
        raise SettingsError(f"{intervention.label}: its SAE's folder {safe_text(str(path))} is gone") from None
    with _KNOWING:
        known = _KNOWN.get(key)
    if known is None:
        known = next((s for s in read_saes(path) if s.name == intervention.sae), None)  # (a file may name any)
        if known is not None:
            _know(key, known)
    if known is None or known.layer != intervention.layer or intervention.feature >= known.d_sae:
        raise SettingsError(f"{intervention.label}: the SAE in {safe_text(str(path))} is another now")
    return known


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
