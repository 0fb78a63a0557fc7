"""Sparse autoencoders' readings of the journey: each SAE checked against the model it reads (its layer
among the model's, its input as wide as the residual) as it is added to a session, and at a position every
SAE's reading of the residual there, the residual asked of the engine once per layer
(contract.engine.ResidualStream)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch

from tokenviz.contract.engine import Capability, Engine, refusal_of, require, shared_prefix
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.features import (
    LABEL_TOKENS,
    MOVED,
    FeatureLabel,
    FeatureLabels,
    FeatureMoves,
    FeatureReading,
    FeatureReadings,
    MovedFeature,
    WatchedFeature,
    parse_feature_watch,
)
from tokenviz.features.feature_notes import notes_of
from tokenviz.features.sae_folder import read_saes
from tokenviz.features.sparse_autoencoder import SparseAutoencoder, sae_named

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


Residuals = dict[int, torch.Tensor]  # by layer: the residual after it at the positions asked, (positions, hidden)


def residuals_at(engine: Engine, ids: Sequence[int], positions: Sequence[int], layers: Iterable[int]) -> Residuals:
    """The residual after each of `layers` at `positions` of `ids`: asked once per layer."""
    stream = require(engine, Capability.RESIDUAL, "an SAE's features")
    return {layer: stream.residual(ids, positions, layer).detach().cpu() for layer in dict.fromkeys(layers)}


def readings_of(
    residuals: Residuals, positions: Sequence[int], saes: Sequence[SparseAutoencoder]
) -> list[list[FeatureReading]]:
    """At each of `positions` (where a step's distribution came from), each SAE's reading of the residual
    there, in the order given."""
    return [[sae.read(residuals[sae.layer][i], p) for sae in saes] for i, p in enumerate(positions)]


def readings_at(
    engine: Engine, ids: Sequence[int], positions: Sequence[int], saes: Sequence[SparseAutoencoder]
) -> list[list[FeatureReading]]:
    """readings_of the residuals at `positions` of `ids`."""
    return readings_of(residuals_at(engine, ids, positions, (s.layer for s in saes)), positions, saes)


def watched_of(
    residuals: Residuals,
    positions: Sequence[int],
    saes: Sequence[SparseAutoencoder],
    watched: Sequence[tuple[str, int]],
) -> list[WatchedFeature]:
    """Each watched (SAE name, feature)'s activation at each of `positions`: its SAE's whole encode there
    (a feature too weak to be among a reading's strongest is followed all the same)."""
    chosen = [(sae_named(saes, name, feature), feature) for name, feature in watched]
    return [
        WatchedFeature(
            sae.name, feature, tuple(positions), tuple(sae.encode(residuals[sae.layer])[:, feature].tolist())
        )
        for sae, feature in chosen
    ]


def watched_at(
    engine: Engine,
    ids: Sequence[int],
    positions: Sequence[int],
    saes: Sequence[SparseAutoencoder],
    watched: Sequence[tuple[str, int]],
) -> list[WatchedFeature]:
    """watched_of the residuals at `positions` of `ids` (only the layers of the SAEs watched are read)."""
    layers = [sae_named(saes, name, feature).layer for name, feature in watched]
    return watched_of(residuals_at(engine, ids, positions, layers), positions, saes, watched)


def labels_of(
    session: Session, sae: SparseAutoencoder, features: Sequence[int], n: int = LABEL_TOKENS
) -> list[FeatureLabel]:
    """Each feature's label (the tokens its decoder row promotes and suppresses most through the model's
    final norm and head), read once a feature: kept by the session, as they depend on weights alone."""
    kept = session.feature_labels
    new = [f for f in dict.fromkeys(features) if (sae.name, f) not in kept]
    if new:
        stream = require(session.engine, Capability.RESIDUAL, "a feature's label")
        logits = stream.through_head(sae.decoder_rows(new)).float().cpu()
        top, bottom = logits.topk(n, dim=-1).indices.tolist(), (-logits).topk(n, dim=-1).indices.tolist()
        piece, notes = session.engine.piece, notes_of(sae)
        for f, up, down in zip(new, top, bottom):
            said, contexts = notes.descriptions.get(f, ""), notes.contexts.get(f, ())
            promotes, suppresses = tuple(map(piece, up)), tuple(map(piece, down))
            kept[(sae.name, f)] = FeatureLabel(
                sae.name, f, promotes, suppresses, tuple(up), tuple(down), description=said, contexts=contexts
            )
    return [kept[(sae.name, f)] for f in features]


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


def follow_features(session: Session) -> tuple[WatchedFeature, ...]:
    """Each watched feature's activation at every step's position (the last prompt token's on, the pending
    step's included), read only where it was not before: a step reads its own position (from its own pass
    where the engine kept it), so following costs an SAE encode a step, not a pass over the journey."""
    watched, followed = session.watched_features, session.followed
    if not watched or not session.records:
        return ()
    interventions = tuple(session.interventions)
    keep = shared_prefix(followed.ids, session.ids) if followed.interventions == interventions else 0
    for values in followed.values.values():
        for position in [p for p in values if p >= keep]:
            del values[position]
    followed.ids, followed.interventions = tuple(session.ids), interventions
    positions = list(range(len(session.prompt_ids) - 1, len(session.ids)))
    missing = sorted({p for key in watched for p in positions if p not in followed.values.get(key, {})})
    for read in watched_at(session.engine, session.ids, missing, session.saes, watched) if missing else ():
        followed.values.setdefault((read.sae, read.id), {}).update(zip(read.positions, read.activations))
    return tuple(
        WatchedFeature(name, feature, tuple(positions), tuple(followed.values[(name, feature)][p] for p in positions))
        for name, feature in watched
    )


def labels_for(session: Session, features: Sequence[tuple[str, int]]) -> FeatureLabels:
    """The labels of these (SAE name, feature)s, each SAE's read in one pass over the head."""
    by_sae: dict[str, list[int]] = {}
    for name, feature in features:
        by_sae.setdefault(name, []).append(feature)
    labels = [
        label
        for name, ids in by_sae.items()
        for label in labels_of(session, sae_named(session.saes, name, max(ids)), ids)
    ]
    return FeatureLabels(tuple(labels))


def watch_feature(session: Session, text: str) -> str:
    """Watch the feature `text` names (feature:SAE:ID), or stop watching it: what is done, in a few words."""
    name, feature = parse_feature_watch(text)
    sae = sae_named(session.saes, name, feature)
    key = (sae.name, feature)
    if key in session.watched_features:
        session.watched_features = tuple(w for w in session.watched_features if w != key)
        return f"not watching {sae.name}#{feature}"
    session.watched_features = (*session.watched_features, key)
    return f"watching {sae.name}#{feature}: F shows it at each position"


def feature_moves(
    a: Engine, b: Engine, ids: Sequence[int], positions: Sequence[int], saes: Sequence[SparseAutoencoder]
) -> list[list[FeatureMoves]]:
    """At each of `positions` of `ids`, each SAE's features whose activations differ most between engine
    `a`'s residual and engine `b`'s (a quantization, another runtime): the same tokens in both."""
    layers = [sae.layer for sae in saes]
    ours, theirs = residuals_at(a, ids, positions, layers), residuals_at(b, ids, positions, layers)
    moves: list[list[FeatureMoves]] = [[] for _ in positions]
    for sae in saes:
        in_a, in_b = sae.encode(ours[sae.layer]), sae.encode(theirs[sae.layer].to(ours[sae.layer].dtype))
        apart = (in_a - in_b).abs()
        for i, p in enumerate(positions):
            order = [f for f in apart[i].argsort(descending=True)[:MOVED].tolist() if apart[i, f] > 0]
            moved = tuple(MovedFeature(f, float(in_a[i, f]), float(in_b[i, f])) for f in order)
            a_l0, b_l0 = int((in_a[i] > 0).sum()), int((in_b[i] > 0).sum())
            moves[i].append(FeatureMoves(sae.name, sae.layer, p, moved, a_l0, b_l0))
    return moves
