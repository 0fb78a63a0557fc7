"""The interventions in force on a model, and the model's own passes beside them.

With any intervention on, every step keeps two distributions: the intervened one, which the sampling
stages and the draw use, and the model's own at the same context (see decoding.unsteered). The own
one comes from a second KV cache the unhooked model keeps along the same tokens: one extra forward
pass of the tokens each step feeds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from tokenviz.backends.shared.resolving import checked
from tokenviz.backends.transformers.cache import crop_layers, full_cache, with_cache
from tokenviz.backends.transformers.intervention_hooks import Hooks, resolve
from tokenviz.backends.transformers.loaded_model_access import ModelAccess
from tokenviz.contract.engine import shared_prefix
from tokenviz.contract.interventions import Intervention
from tokenviz.tensors.transfer import DeviceTimer, ids_to_device


class InterventionState:
    def __init__(
        self,
        runner: ModelAccess,
        interventions: Sequence[Intervention],
        context: Sequence[int],
        token_id: Callable[[str], int],
    ):
        """Resolve `interventions` on the model's own passes (a mean ablation over `context`) and hook them in."""
        info = runner.info
        self.interventions = checked(interventions, info)
        resolved = resolve(runner.model, info.heads, self.interventions, context, runner.encode, token_id)
        self.runner = runner
        self.hooks = Hooks(runner.model, info.heads, resolved)
        self._cache: Any = full_cache()
        self._fed: list[int] = []

    @torch.inference_mode()
    def own_logits(self, ids: Sequence[int]) -> tuple[torch.Tensor, DeviceTimer]:
        """The model's own next-token logits after `ids` (vocab,), its cache brought from the tokens it
        had to these: cropped to what both share, then fed the rest."""
        keep = min(shared_prefix(self._fed, ids), len(ids) - 1)
        if keep == 0:
            self._cache = full_cache()
        else:
            crop_layers(self._cache, keep)
        timer = DeviceTimer(self.runner.device)
        with self.hooks.suspended():
            out = self.runner.model(
                input_ids=ids_to_device(ids[keep:], self.runner.device),
                **with_cache(self.runner.model, self._cache),
                use_cache=True,
                logits_to_keep=1,
            )
        self._fed = list(ids)
        return out.logits[0, -1], timer.stop()

    def remove(self) -> None:
        self.hooks.remove()

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """The model as it is without these interventions, inside the block."""
        with self.hooks.suspended():
            yield
