"""Sparse autoencoders' readings of the journey: each SAE checked against the model it reads (its layer
among the model's, its input as wide as the residual) as it is added to a session, and at a position every
SAE's reading of the residual there, the residual asked of the engine once per layer
(contract.engine.ResidualStream)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tokenviz.contract.engine import Capability, Engine, refusal_of, require
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.features import FeatureReading, FeatureReadings
from tokenviz.features.sae_folder import read_saes
from tokenviz.features.sparse_autoencoder import SparseAutoencoder

if TYPE_CHECKING:
    from tokenviz.journey.session import Session

NO_SAE = "no SAE is loaded: add one with E (its folder), or start tokenviz with --sae DIR"


def check_saes(engine: Engine, saes: Sequence[SparseAutoencoder], option: str = "--sae") -> None:
    """One line for an SAE the model cannot feed: no residual from its engine, a layer it lacks, a width
    that is not its residual's."""
    info = engine.info
    line = refusal_of(info, Capability.RESIDUAL, option) if saes else None
    if line is not None:
        raise TokenvizError(line)
    for sae in saes:
        said = f"{option} {sae.name} ({sae.layout}) reads the residual after layer {sae.layer}"
        if not 0 <= sae.layer < info.layers:
            raise TokenvizError(f"{said}; {info.name}'s layers are 0-{info.layers - 1}")
        if sae.d_in != info.hidden:
            raise TokenvizError(f"{said}, {sae.d_in:,} wide; {info.name}'s residual is {info.hidden:,} wide")


def readings_at(
    engine: Engine, ids: Sequence[int], positions: Sequence[int], saes: Sequence[SparseAutoencoder]
) -> list[list[FeatureReading]]:
    """At each of `positions` of `ids` (where a step's distribution came from), each SAE's reading of the
    residual there, in the order given; the residual asked once per layer for every position."""
    stream = require(engine, Capability.RESIDUAL, "an SAE's features")
    layers = dict.fromkeys(s.layer for s in saes)
    residuals = {layer: stream.residual(ids, positions, layer).detach().cpu() for layer in layers}
    return [[sae.read(residuals[sae.layer][i], p) for sae in saes] for i, p in enumerate(positions)]


def add_saes(session: Session, folder: str, option: str = "--sae") -> tuple[SparseAutoencoder, ...]:
    """The SAEs in `folder`, checked against the session's model and added to those it holds."""
    saes = read_saes(folder)
    check_saes(session.engine, saes, option)
    session.saes = (*session.saes, *saes)
    return tuple(saes)


def features_at(session: Session, position: int) -> FeatureReadings:
    """Every SAE the session holds, read at `position` of its journey."""
    if not session.saes:
        raise TokenvizError(NO_SAE)
    if not 0 <= position < len(session.ids):
        raise TokenvizError(f"no position {position}: the journey has {len(session.ids)} tokens")
    ids = tuple(session.ids[: position + 1])
    (readings,) = readings_at(session.engine, ids, [position], session.saes)
    return FeatureReadings(position, tuple(readings), ids)
