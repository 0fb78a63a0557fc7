"""Interventions on a model a server runs: steering vectors the vllm-lens plugin adds to its residual stream.

Each request sent while they are in force carries them (`apply_steering_vectors` in `vllm_xargs`): a
steering's scaled direction after its layer at every position; a patch as the difference between its
source's residual and the journey's at its position (the server adds it: the residual becomes the
source's); an SAE's feature steers as a steering does, and a clamp of one is, at every position, the
difference between the clamped residual and the journey's there (one more request a step reads it). The
plugin recomputes a steered request's whole prompt (it does not read vLLM's prefix cache
for it), but vLLM still stores what it computed: a steered request carries a cache salt of its own, so no
plain request later reads steered keys and values. The model's own distribution beside them is a plain
request (the server's top N). A head ablation needs a hook inside attention, which would mean sending
code to the server: it is refused. The vectors are plain float32 tensors (served.activations.tensor_entry).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, assert_never

import numpy as np
import torch

from tokenviz.backends.served.activations import tensor_entry
from tokenviz.backends.served.internals import ServedInternals
from tokenviz.backends.shared.resolving import checked, patch_source_ids, scaled_vector
from tokenviz.backends.shared.steering_direction import steering_direction
from tokenviz.contract.engine import Elapsed
from tokenviz.contract.errors import SettingsError
from tokenviz.contract.interventions import (
    FeatureClamp,
    FeatureSteering,
    HeadAblation,
    Intervention,
    Patch,
    Steering,
    Suspendable,
)
from tokenviz.contract.records import ModelInfo
from tokenviz.contract.results import Drawn
from tokenviz.features.feature_edits import Clamp, feature_vector

NO_ABLATION = (
    "a head of a served model cannot be ablated: it needs a hook inside the server's attention, which would "
    "mean sending it code to run (tokenviz never does); steering and patching work"
)
PATCHES_KEPT = 32  # journey residuals kept per patch (one per prefix asked: a step, its rewinds and branches)
KEPT_BYTES = 256 << 20  # and their bytes at most (a clamp's are every position's rows)
SALT_CHARS = 32  # of the cache salt (vLLM takes up to 128)


@dataclass(frozen=True)
class Vector:
    """One vector the server adds after `layer` at every position, or a row of `values` at each of `positions`."""

    layer: int
    values: np.ndarray  # (hidden,) float32, or (len(positions), hidden)
    positions: tuple[int, ...] | None = None

    def entry(self) -> dict[str, Any]:
        """As the plugin's SteeringVector takes it (JSON)."""
        if self.positions is None:
            return {"activations": tensor_entry(self.values[None]), "layer_indices": [self.layer], "scale": 1.0}
        rows = self.values.reshape(len(self.positions), -1)
        return {
            "activations": tensor_entry(rows[None]),
            "layer_indices": [self.layer],
            "scale": 1.0,
            "position_indices": list(self.positions),
        }


def request_fields(vectors: Sequence[Vector], xargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """A request's extra fields: the plugin's `xargs`, and `vectors` with the cache salt of a request
    steered by them (none where there are none)."""
    xargs = dict(xargs or {})
    if not vectors:
        return {"vllm_xargs": xargs} if xargs else {}
    sent = json.dumps([v.entry() for v in vectors])
    salt = "tokenviz-" + hashlib.sha256(sent.encode()).hexdigest()[:SALT_CHARS]
    return {"vllm_xargs": {**xargs, "apply_steering_vectors": sent}, "cache_salt": salt}


class SteeredEngine(Protocol):
    """What the steering reaches of its served engine (backends.served.engine is one)."""

    steering: ServedSteering | None  # the interventions in force: this while it is

    @property
    def info(self) -> ModelInfo: ...

    @property
    def internals(self) -> ServedInternals | None: ...

    def encode(self, text: str, special_tokens: bool = True) -> list[int]: ...

    def own_top(self, ids: Sequence[int]) -> Drawn:
        """The model's own top N after `ids`, sent without the steering in force."""


class ServedSteering(Suspendable):
    """The interventions in force on a served model (contract.engine.Intervening): steering vectors sent
    with each of its engine's requests while it is active."""

    def __init__(
        self,
        engine: SteeredEngine,
        interventions: Sequence[Intervention],
        token_id: Callable[[str], int],
    ):
        """Resolve `interventions` on the model's own passes (no steering in force while they are read)."""
        info = engine.info
        self.interventions = checked(interventions, info)
        if any(isinstance(i, HeadAblation) for i in self.interventions):
            raise SettingsError(NO_ABLATION)
        assert engine.internals is not None  # asked only behind the interventions' capability
        self.engine, self.internals = engine, engine.internals
        self.active = True
        self._resolved: list[Vector | tuple[Patch, np.ndarray] | tuple[FeatureClamp, Clamp]] = []
        for i in self.interventions:
            match i:
                case Steering():
                    self._resolved.append(Vector(i.layer, scaled_vector(i, self._direction(i, token_id))))
                case FeatureSteering():
                    self._resolved.append(Vector(i.layer, scaled_vector(i, feature_vector(i).numpy())))
                case Patch():  # with its source's residual
                    ids = patch_source_ids(i, engine.encode)
                    self._resolved.append((i, self.internals.residual(ids[: i.position + 1], i.layer, {})[-1]))
                case FeatureClamp():
                    self._resolved.append((i, Clamp(i)))
                case HeadAblation():
                    raise SettingsError(NO_ABLATION)
                case _:
                    assert_never(i)
        self._journey: OrderedDict[tuple[int, tuple[int, ...]], np.ndarray] = OrderedDict()

    def _direction(self, steering: Steering, token_id: Callable[[str], int]) -> np.ndarray:
        """As every backend's (backends.shared.steering_direction), from the server's residuals and the
        model's head read here."""

        def head_rows(toward: str, away: str) -> tuple[np.ndarray, np.ndarray]:
            rows = self.internals.head.output_rows([token_id(toward), token_id(away)])
            return np.asarray(rows[0]), np.asarray(rows[1])

        def residual(text: str) -> np.ndarray:
            return np.asarray(self.internals.residual(self.engine.encode(text), steering.layer, {})[-1])

        return steering_direction(steering, head_rows, residual)

    def vectors(self, ids: Sequence[int]) -> list[Vector]:
        """What a request over `ids` carries: every steering, and each patch whose position `ids` reach."""
        return self._vectors(ids, len(self._resolved))

    def _vectors(self, ids: Sequence[int], upto: int) -> list[Vector]:
        out: list[Vector] = []
        for k, resolved in enumerate(self._resolved[:upto]):
            if isinstance(resolved, Vector):
                out.append(resolved)
            elif isinstance(resolved[1], Clamp):
                rows = self._journey_rows(tuple(ids), k)
                moved = resolved[1](torch.from_numpy(rows)).numpy() - rows
                out.append(Vector(resolved[0].layer, moved, tuple(range(len(ids)))))
            elif isinstance(resolved[0], Patch) and resolved[0].position < len(ids):
                source = resolved[1]
                moved = source - self._journey_residual(ids, k)
                out.append(Vector(resolved[0].layer, moved, (resolved[0].position,)))
        return out

    def _journey_rows(self, ids: tuple[int, ...], k: int) -> np.ndarray:
        """The journey's residual at intervention `k`'s layer, every position of `ids`, with the interventions
        before it in force (those after it cannot reach it: the server adds them in order); kept, the newest
        PATCHES_KEPT and at most KEPT_BYTES (a clamp keeps a whole journey's rows)."""
        key = (k, ids)
        if key not in self._journey:
            extra = request_fields(self._vectors(ids, k))
            rows = self.internals.residual(list(ids), self.interventions[k].layer, extra)
            self._journey[key] = np.ascontiguousarray(rows, dtype=np.float32)
            while len(self._journey) > 1 and (
                len(self._journey) > PATCHES_KEPT or sum(r.nbytes for r in self._journey.values()) > KEPT_BYTES
            ):
                self._journey.popitem(last=False)
        self._journey.move_to_end(key)
        return self._journey[key]

    def _journey_residual(self, ids: Sequence[int], k: int) -> np.ndarray:
        """The journey's residual at patch `k`'s layer and position (_journey_rows of the tokens up to it)."""
        patch = self._resolved[k]
        assert isinstance(patch, tuple) and isinstance(patch[0], Patch)
        rows = self._journey_rows(tuple(ids[: patch[0].position + 1]), k)
        last: np.ndarray = rows[-1]
        return last

    def own_logits(self, ids: Sequence[int]) -> tuple[Drawn, Elapsed]:
        """The model's own distribution after `ids`, as the server gives it (its top N, greedy: no draw is
        kept of it) and the request's time: a served model's scores are its top N (a Drawn)."""
        drawn = self.engine.own_top(ids)  # sent without the vectors, whatever is in force
        return drawn, Elapsed(drawn.ms)

    def remove(self) -> None:
        if self.engine.steering is self:
            self.engine.steering = None
