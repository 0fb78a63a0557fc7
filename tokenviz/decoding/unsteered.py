"""With interventions on: the model's own distribution beside the intervened one, and the KL between them."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from tokenviz.contract.engine import Timer
from tokenviz.contract.records import Candidate, Unsteered


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


def read_unsteered(host: dict[str, np.ndarray], piece: Callable[[int], str], timer: Timer) -> Unsteered:
    ids, logits, probs = (host[f"unsteered.{k}"].tolist() for k in ("ids", "logits", "probs"))
    top = tuple(Candidate(id=i, text=piece(i), logit=lg, prob=p) for i, lg, p in zip(ids, logits, probs))
    return Unsteered(top=top, kl=float(host["unsteered.kl"][0]), ms=timer.ms())
