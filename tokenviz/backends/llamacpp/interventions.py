"""Interventions on a GGUF in llama.cpp (contract.engine.Intervening): a steering is llama.cpp's own control
vector (llama_set_adapter_cvec: its scaled direction added to the residual after its layer, at every
position); a patch is its source's residual written over the journey's at its layer and position, through
the evaluation callback (capture.py) as llama.cpp computes that tensor; an SAE's feature steers as a
control vector does, and a clamp of one changes each row of that tensor through the callback. All are in force on the
journey's context and on the contexts the lens and attention rows read, so every view shows the model the
steps run. The model's own distribution beside them comes from a context of its own with no edit, which
keeps its cache along the journey's tokens.

Directions are read from the model as it is, with nothing in force: two tokens' rows of the output head
(dequantized from the GGUF, as the transformers backend reads its own), or two texts' residuals after the
layer at their last token. A head's ablation is refused: it would act inside llama.cpp's attention, not on
the residual stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, assert_never

import numpy as np
import torch

from tokenviz.backends.llamacpp.capture import RowMap, Write, Writes
from tokenviz.backends.llamacpp.internals import LlamaInternals
from tokenviz.backends.llamacpp.pinned import layer_output
from tokenviz.backends.llamacpp.refusals import NO_ABLATION, NO_LAYER_0
from tokenviz.backends.llamacpp.runtime import NO_EDITS, Edits, Runtime
from tokenviz.backends.shared.resolving import checked, patch_source_ids, scaled_vector
from tokenviz.backends.shared.steering_direction import steering_direction
from tokenviz.contract.engine import Elapsed, shared_prefix
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
from tokenviz.features.feature_edits import Clamp, feature_vector


class OwnModel:
    """The model as it is, on a context of its own whose cache follows the tokens it was last asked about."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime

    def logits(self, ids: Sequence[int]) -> tuple[torch.Tensor, Elapsed]:
        """llama.cpp's logits after `ids` with no edit, its cache cut to what it shares with them, the rest fed."""
        keep = min(shared_prefix(self.runtime.held, ids), len(ids) - 1)
        self.runtime.cut(keep)
        started = time.perf_counter()
        rows = self.runtime.decode(list(ids[keep:]), keep)
        return torch.from_numpy(np.ascontiguousarray(rows[-1])), Elapsed((time.perf_counter() - started) * 1e3)


class EditedEngine(Protocol):
    """What the interventions reach of their engine (backends.llamacpp.engine is one)."""

    intervening: LlamaIntervening | None  # the interventions in force: these while they are
    internals: LlamaInternals

    @property
    def info(self) -> ModelInfo: ...

    @property
    def own_model(self) -> OwnModel: ...

    def encode(self, text: str, special_tokens: bool = True) -> list[int]: ...

    def take_edits(self, edits: Edits) -> None:
        """Run the journey's passes and the views' with `edits` from the next pass on."""


class LlamaIntervening(Suspendable):
    """The interventions in force on a GGUF in llama.cpp, as one control vector and the rows patches write."""

    def __init__(self, engine: EditedEngine, interventions: Sequence[Intervention], token_id: Callable[[str], int]):
        """Resolve `interventions` on the model as it is (nothing in force while they are read)."""
        info = engine.info
        self.interventions = checked(interventions, info)
        self.engine, self.internals = engine, engine.internals
        self.active = True
        vectors: dict[int, np.ndarray] = {}  # each steering's scaled direction, by its place in the list
        for k, i in enumerate(self.interventions):
            match i:
                case HeadAblation():
                    raise SettingsError(NO_ABLATION)
                case Steering() | FeatureSteering():
                    if i.layer == 0:
                        raise SettingsError(f"{i.label}: {NO_LAYER_0}")
                    direction = self._direction(i, token_id) if isinstance(i, Steering) else feature_vector(i).numpy()
                    vectors[k] = scaled_vector(i, direction)
                case Patch() | FeatureClamp():
                    pass
                case _:
                    assert_never(i)
        self._edits = Edits(self._control(vectors), self._writes(vectors))

    def _direction(self, steering: Steering, token_id: Callable[[str], int]) -> np.ndarray:
        """As every backend's (backends.shared.steering_direction), from llama.cpp's head and residuals."""

        def head_rows(toward: str, away: str) -> tuple[np.ndarray, np.ndarray]:
            rows = self.internals.head.unembeddings([token_id(toward), token_id(away)])
            return np.asarray(rows[0], dtype=np.float32), np.asarray(rows[1], dtype=np.float32)

        def residual(text: str) -> np.ndarray:
            ids = self.engine.encode(text)
            return np.asarray(self.internals.residual(ids, steering.layer, len(ids) - 1), dtype=np.float32)

        return steering_direction(steering, head_rows, residual)

    def _control(self, vectors: dict[int, np.ndarray]) -> np.ndarray | None:
        """The control vector: each layer's steerings summed (row L - 1 is added after layer L)."""
        if not vectors:
            return None
        shape = self.internals.runtime.shape
        control = np.zeros((shape.layers - 1, shape.hidden), dtype=np.float32)
        for k, vector in vectors.items():
            control[self.interventions[k].layer - 1] += vector
        return control

    def _source_row(self, patch: Patch) -> np.ndarray:
        """A patch's row: its source's residual after its layer at its position, read alone."""
        ids = patch_source_ids(patch, self.engine.encode)
        return np.asarray(self.internals.residual(ids, patch.layer, patch.position).numpy(), dtype=np.float32)

    def _writes(self, vectors: dict[int, np.ndarray]) -> Writes | None:
        """Each patch's row: its source's residual plus the steerings at its layer listed after it (the
        transformers backend's hooks run in the list's order; llama.cpp adds its control vector before the
        patch is written). A layer with a clamp is one map instead (_in_order)."""
        clamped = dict.fromkeys(i.layer for i in self.interventions if isinstance(i, FeatureClamp))
        width = self.internals.runtime.shape.hidden
        writes: dict[str, list[Write]] = {layer_output(n): [RowMap(width, self._in_order(n, vectors))] for n in clamped}
        for k, i in enumerate(self.interventions):
            if not isinstance(i, Patch) or i.layer in clamped:
                continue
            later = [v for j, v in vectors.items() if j > k and self.interventions[j].layer == i.layer]
            row = np.ascontiguousarray(self._source_row(i) + sum(later, np.zeros(width, np.float32)), np.float32)
            writes.setdefault(layer_output(i.layer), []).append((i.position, row))
        return {name: tuple(rows) for name, rows in writes.items()} or None

    def _in_order(self, layer: int, vectors: dict[int, np.ndarray]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """The layer's interventions on its output rows in the list's order, as the transformers backend's
        hooks run them: the control vector, which llama.cpp added first, taken off, then each steering added,
        patch written and clamp applied in turn."""
        steps: list[np.ndarray | tuple[int, np.ndarray] | Clamp] = []
        for k, i in enumerate(self.interventions):
            if i.layer != layer:
                continue
            if k in vectors:
                steps.append(vectors[k])
            elif isinstance(i, Patch):
                steps.append((i.position, self._source_row(i)))
            elif isinstance(i, FeatureClamp):
                steps.append(Clamp(i))
        added = sum((v for k, v in vectors.items() if self.interventions[k].layer == layer), np.float32(0))

        def change(rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
            x = rows - added
            for step in steps:
                if isinstance(step, Clamp):
                    x = step(torch.from_numpy(np.ascontiguousarray(x))).numpy()
                elif isinstance(step, tuple):
                    x[positions == step[0]] = step[1]
                else:
                    x = x + step
            return x

        return change

    @property
    def edits(self) -> Edits:
        return self._edits if self.active else NO_EDITS

    def apply(self) -> None:
        """Put these edits (or none, while suspended) in force, where these are the engine's interventions."""
        if self.engine.intervening is self:
            self.engine.take_edits(self.edits)

    def own_logits(self, ids: Sequence[int]) -> tuple[torch.Tensor, Elapsed]:
        return self.engine.own_model.logits(ids)

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """The model as it is inside the block (the journey's context and the views' with no edit)."""
        try:
            with super().suspended():
                self.apply()
                yield
        finally:
            self.apply()

    def remove(self) -> None:
        if self.engine.intervening is self:
            self.engine.intervening = None
            self.engine.take_edits(NO_EDITS)
