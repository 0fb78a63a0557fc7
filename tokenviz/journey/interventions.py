"""The interventions in force on a journey's model, and the model's own distribution beside them.

With any intervention on, every step keeps two distributions: the intervened one, which the sampling
stages and the draw use, and the model's own at the same context (with the KL between them). The
own one comes from a second KV cache the unhooked model keeps along the same tokens: one extra
forward pass of the tokens each step feeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from tokenviz.contract.interventions import Intervention, check_against
from tokenviz.contract.records import Candidate, Unsteered
from tokenviz.model.cache import crop_layers, full_cache, shared_prefix, with_cache
from tokenviz.model.interventions import Hooks, resolve
from tokenviz.model.runner import ModelRunner
from tokenviz.model.transfer import DeviceTimer, ids_to_device


class InterventionState:
    def __init__(
        self,
        runner: ModelRunner,
        interventions: Sequence[Intervention],
        context: Sequence[int],
        token_id: Callable[[str], int],
    ):
        """Resolve `interventions` on the model's own passes (a mean ablation over `context`) and hook them in."""
        info = runner.info
        self.interventions = tuple(interventions)
        check_against(self.interventions, info.layers, info.heads)
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


def unsteered_on_device(logits: torch.Tensor, own: torch.Tensor, n: int) -> dict[str, torch.Tensor]:
    """The own distribution's top-n and KL(intervened ‖ own) in bits, still on the device."""
    p = torch.log_softmax(logits.float().reshape(-1), -1)
    q = torch.log_softmax(own.float().reshape(-1).to(p.device), -1)
    kl = (p.exp() * (p - q)).nan_to_num().sum().clamp(min=0) / math.log(2)
    top_logits, top_ids = torch.topk(q, min(n, q.numel()))
    return {
        "unsteered.ids": top_ids,
        "unsteered.logits": own.float().reshape(-1).to(p.device)[top_ids].double(),
        "unsteered.probs": top_logits.exp().double(),
        "unsteered.kl": kl.double().reshape(1),
    }


def read_unsteered(host: dict[str, np.ndarray], piece: Callable[[int], str], timer: DeviceTimer) -> Unsteered:
    ids, logits, probs = (host[f"unsteered.{k}"].tolist() for k in ("ids", "logits", "probs"))
    top = tuple(Candidate(id=i, text=piece(i), logit=lg, prob=p) for i, lg, p in zip(ids, logits, probs))
    return Unsteered(top=top, kl=float(host["unsteered.kl"][0]), ms=timer.ms())
